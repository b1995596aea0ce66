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
