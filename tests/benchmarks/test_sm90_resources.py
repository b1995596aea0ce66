"""benchmarks/sm90_resources.py: registers and spills read from a cubin's .nv.info, programs an SM
from them, and one real launch compiled for sm_90 on the CPU."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from repo_paths import REPO, script

SCRIPT = REPO / "benchmarks" / "sm90_resources.py"


def _module():
    return script(SCRIPT)


def _elf(info: bytes) -> bytes:
    """A minimal ELF64 image: section headers for null, .shstrtab and .nv.info (as a cubin lays them)."""
    names = b"\0.shstrtab\0.nv.info\0"
    header_at = 64 + len(names) + len(info)
    image = bytearray(64)
    image[:4] = b"\x7fELF"
    struct.pack_into("<Q", image, 0x28, header_at)
    struct.pack_into("<HHH", image, 0x3A, 64, 3, 1)
    image += names + info
    sections = [(0, 0, 0, 0, 0, 0), (1, 3, 64, len(names), 0, 0), (11, 0, 64 + len(names), len(info), 0, 0)]
    for name, kind, offset, size, _, _ in sections:
        image += struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)
    return bytes(image)


def test_registers_and_spills_are_read_from_nv_info():
    module = _module()
    attribute = lambda code, value: struct.pack("<BBHII", 0x04, code, 8, 14, value)  # noqa: E731
    other = struct.pack("<BBHII", 0x04, 0x12, 8, 14, 999)  # min stack size: not reported
    info = attribute(module.EIATTR_REGCOUNT, 232) + other + attribute(module.EIATTR_FRAME_SIZE, 56)
    assert module.cubin_resources(_elf(info)) == {"registers": 232, "spill_bytes": 56}
    assert module.cubin_resources(_elf(b"")) == {}


def test_programs_an_sm_hold():
    """Registers a warp at a time in units of 256, shared memory with 1 KiB reserved a program."""
    programs = _module().programs_per_sm
    assert programs(146, 71680, 4) == 3  # a chain's attention (shared memory bounds it)
    assert programs(232, 39424, 4) == 2  # a tree's (registers bound it)
    assert programs(168, 39424, 4) == 3 and programs(128, 39424, 4) == 4
    assert programs(64, 2048, 4) == 8 and programs(255, 0, 8) == 1
    assert programs(32, 0, 1) == 32  # at most 32 programs


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, compile on it")
def test_a_launch_compiles_and_reports_its_resources():
    """One attention launch (a 1-token chain over a 64-slot cache: one split, no merge) through the
    harness, to a cubin: its registers, spills, shared memory and programs an SM."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(SCRIPT), "attention", "--rows", "1", "--capacity", "64",
                           "--prefix", "10"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    split = [r for r in rows if r["kernel"] == "_split_kernel"]
    assert {r["launch"].split(" rows")[0] for r in split} == {"attention chain", "attention tree"}
    for row in split:
        assert 0 < row["registers"] <= 255 and row["spill_bytes"] >= 0 and row["shared_bytes"] > 0
        assert 1 <= row["programs_per_sm"] <= 32
