"""Import before specgen.gpu: without CUDA, Triton kernels run in the interpreter (CI has no GPU).

Triton reads TRITON_INTERPRET when @triton.jit decorates a function, i.e. when specgen.gpu.* is
first imported, so the test modules import this module first. With CUDA the real kernels compile.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    assert "specgen.gpu.kernels.warp" not in sys.modules, "import triton_cpu before anything imports specgen.gpu"

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INTERPRETED = DEVICE.type == "cpu"


def _patch_once() -> None:
    """The interpreter patches triton.language (tl, and tl.core where a function's module names
    it) for the interpreter at each launch (undone after it), then again at every device-function
    call inside the launch (tl.sum, tl.max, a kernel file's helpers): some 1.5 ms a call on the
    2-core CI machine, the larger part of a kernel test's time where programs call helpers in
    loops. A nested patch of modules the launch has patched already changes nothing, so inside a
    launch it is skipped; one that names a module not yet patched (tl.core, from Triton's own
    tl.zeros) still runs. The kernels run as before; where Triton's interpreter lacks these names,
    nothing changes."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    executor, patch = getattr(interpreter, "GridExecutor", None), getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    if executor is None or patch is None or scope is None or getattr(patch, "specgen_once", False):
        return
    patched: set[str] = set()  # the modules this launch has patched
    launch = executor.__call__

    def call(self, *args, **kwargs):
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    def patch_lang(fn):
        langs = {name for name, module in (("tl", tl), ("core", tl.core))
                 if any(value is module for value in fn.__globals__.values())}
        if patched and langs <= patched:
            return scope()
        done = patch(fn)
        patched.update(langs)
        return done

    patch_lang.specgen_once = True
    executor.__call__ = call
    interpreter._patch_lang = patch_lang


def _no_overflow_checks() -> None:
    """The interpreter checks every int32 add, subtract and multiply for overflow (InterpreterOptions
    sanitize_overflow: each operand cast to int64, the result compared with int32's bounds, an
    assert): some 40% of an interpreted attention launch's time on the 2-core CI machine. A GPU
    compile drops those checks unless the kernel is compiled with debug on, and the kernels keep
    their offsets in range where they can leave int32 (int64 rows, the wrappers' asserts), so the
    tests run the kernels as the GPU does. Where Triton's interpreter lacks these names, nothing
    changes."""
    import dataclasses

    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


if INTERPRETED:
    _patch_once()
    _no_overflow_checks()
