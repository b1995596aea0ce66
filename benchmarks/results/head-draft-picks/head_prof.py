"""Kernel sequence of the last rounds of `specgen bench --proposer eagle` (chrome trace, processed
here): name, grid, duration and gap before each kernel. argv: pair.toml, out folder."""
import json, os, sys
import torch
from specgen.cli.app import app

pair, out = sys.argv[1], sys.argv[2]
args = ["bench", "-p", pair, "--proposer", "eagle", "--k", "4", "-t", "0", "--num-prompts", "1", "-n", "24",
        "--baseline", "", "--no-fp32-check", "--format", "json"]
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    try:
        app(args, prog_name="specgen", standalone_mode=False)
    except SystemExit:
        pass
    torch.cuda.synchronize()
trace = os.path.join("/tmp", "trace.json")
prof.export_chrome_trace(trace)
events = json.load(open(trace))["traceEvents"]
kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
print("kernels", len(kernels))
rows, prev = [], None
for e in kernels[-3000:]:
    gap = 0.0 if prev is None else e["ts"] - prev
    prev = e["ts"] + e["dur"]
    grid = e.get("args", {}).get("grid")
    rows.append(f"{gap:9.2f} {e['dur']:8.2f}  {str(grid):18s} {e['name'][:90]}")
open(os.path.join(out, "head-kernels.txt"), "w").write("\n".join(rows) + "\n")
