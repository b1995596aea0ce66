"""Programmatic dependent launch (sm_90+): a step's next kernel starts while this one finishes.

Why: a 1-token step of a 1B draft is about 130 kernels of 2 to 20 µs, and each launch in a
captured graph waits for the kernel before it to end before its programs are even scheduled. With
the launch attribute (`launch_pdl`), the next kernel's programs are scheduled once every program
of the running one has passed `release_next` (or ended), and they wait in `wait_previous` until it
has ended and its writes are visible. Launch and set-up overlap the previous kernel's tail: on an
H200 a captured Llama-3.2-1B-shaped step went from 0.973 to 0.896 ms, a Llama-3-8B-shaped one from
4.32 to 4.11 ms (`git show 1b54921:docs/benchmarks.md`, "Dependent launch (H200)").

The rules every kernel launched with it keeps, so that ordering stays what stream order gives:
- `wait_previous` first, in every program, before any load or store: nothing is read early (a
  weight tile fetched before the wait was slower: it broke the loop's software pipeline), nothing
  written that an earlier kernel may still read, and since every program waits, a kernel ends only
  after the one before it ended, so the guarantee chains through any number of kernels.
- `release_next` once its main loop is done (or at once, for a kernel that is all tail); it is a
  hint, never a condition for correctness.
A kernel launched without the attribute (torch's) runs in plain stream order; `wait_previous` in a
kernel whose predecessor gave no permission returns at once.

Kernel files import these two by name and pass `launch_options(dependent)` to their launch.
Runners decide `dependent` from the profile (the dependent_launch fusion of `[kernels]`,
gpu/policy.py).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_previous(DEPENDENT: tl.constexpr):
    """Wait until the kernel launched before this one has ended and its writes are visible."""
    if DEPENDENT:
        gdc_wait()


@triton.jit
def release_next(DEPENDENT: tl.constexpr):
    """Let the next kernel's programs be scheduled (they still wait in wait_previous)."""
    if DEPENDENT:
        gdc_launch_dependents()


def launch_options(dependent: bool, fp_fusion: bool = True) -> dict:
    """The keywords of every launch: dependent launch's attribute only when asked, so that the
    interpreter and Triton versions without it never see the keyword; and fused multiply-adds
    (`enable_fp_fusion`) always said, never left to Triton's default. Why: Triton 3.9 warns on
    stderr at the first compile where it is left unset, and 3.10 turns the default off, which
    would change the bits of every kernel that rounds a product before an add, under the same
    specgen. On is what the kernels were measured and bit-tested with; off (fp_fusion=False) is
    for kernels that round each product as their torch reference does."""
    return {"enable_fp_fusion": fp_fusion, **({"launch_pdl": True} if dependent else {})}

