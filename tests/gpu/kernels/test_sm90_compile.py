"""Every Triton kernel that specgen's GPU wrappers launch compiles for an H100/H200 (sm_90), on a CPU.

Why: without a GPU (CI) the kernels only run in the Triton interpreter, which does not type-check:
a loop-carried variable that changes type (int32 -> int64) or shape passes every CPU test and
breaks the first GPU launch. tests/sm90_compile.py calls the wrappers of gpu/kernels/attention.py,
linear.py, verify.py, warp.py, norm.py, step_io.py, tree_build.py and tree_merge.py over their compile-time branches, specialises each launch as
Triton does on a GPU and compiles it for sm_90 through the front end (TTIR), launching nothing;
see its docstring. It runs in a subprocess without TRITON_INTERPRET, which the other test modules
set in this process (tests/triton_cpu.py), so that @triton.jit gives compilable JITFunctions.

Checked: the harness reports the bug class it exists for (self-check kernels), no launch fails to
compile, and every top-level *_kernel of the listed modules was compiled at least once (a new kernel
without a scenario in sm90_compile.py fails here). With CUDA the real compiles happen anyway: skipped.
SPECGEN_SM90_STAGE=ttgir (passed through) compiles further; about 30 s instead of 10 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from repo_paths import REPO, TESTS

SCRIPT = TESTS / "sm90_compile.py"
SRC = REPO / "src"
MODULES = ("attention", "linear", "verify", "warp", "cuts", "argmax", "norm", "step_io", "tree_walk", "compact", "tree_build",
           "tree_merge", "topw")  # specgen.gpu.*

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU compiles the kernels for real")


@pytest.fixture(scope="module")
def report() -> dict:
    """The script's JSON report (one run for the module's tests)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{SCRIPT.name} failed:\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["skip"]:
        pytest.skip(result["skip"])
    return result


def _describe(variant: dict) -> str:
    constexprs = ", ".join(f"{k}={v}" for k, v in {**variant["constexprs"], **variant["specialized"]}.items())
    return f"{variant['kernel']}[{constexprs}] from {variant['scenario']!r}:\n{variant['error']}"


def test_harness_reports_loop_carried_type_changes(report):
    """Kernels whose loop-carried variable changes type (int32 -> int64) or shape (scalar -> [16]),
    which the interpreter runs without complaint, are reported as errors; their fixed form compiles."""
    check = report["selfcheck"]
    assert len(check) == 3
    for name, outcome in check.items():
        assert outcome["status"] == outcome["expect"], f"{name}: {outcome['error']}"


def test_every_launch_compiles_for_sm90(report):
    assert not report["scenario_errors"], "wrappers failed before their launch:\n" + "\n".join(
        f"{label}:\n{trace}" for label, trace in report["scenario_errors"].items())
    failed = [v for v in report["variants"] if v["status"] != "ok"]
    assert not failed, (f"{len(failed)} of {len(report['variants'])} launches do not compile for sm_90 "
                        f"(triton {report['triton']}, up to {report['stage']}):\n\n"
                        + "\n\n".join(map(_describe, failed)))


def test_every_kernel_is_compiled(report):
    """Each top-level kernel of the listed modules is launched by some scenario of sm90_compile.py."""
    kernels = report["kernels"]
    for module in MODULES:  # the collection itself works: JITFunctions, not interpreted ones
        assert any(k.startswith(f"specgen.gpu.kernels.{module}.") for k in kernels), \
            f"no *_kernel found in gpu/kernels/{module}.py"
    compiled = {v["kernel"] for v in report["variants"]}
    missing = [k for k in kernels if k not in compiled]
    assert not missing, f"kernels no scenario of {SCRIPT.name} launches (add one): {missing}"


