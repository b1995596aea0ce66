"""The project's linear kernel on the Llama-3.2-1B and 8B shapes: table picks (tensor cores, split-K)
against matrix-vector configurations, at 1 and 5 rows, with GEMV_ROWS 8 (rows one after another in
a program) and 1 (a program per row). 16 distinct weights per chain, captured, dependent launch."""
import sys, time, torch
from specgen.gpu import linear as L

dev = "cuda"
torch.manual_seed(0)
CHAIN = 16
SHAPES = {"qkv": (3072, 2048, False), "o": (2048, 2048, False), "gate_up": (8192, 2048, True),
          "down": (2048, 8192, False), "8b-qkv": (6144, 4096, False), "8b-o": (4096, 4096, False),
          "8b-down": (4096, 14336, False)}
GEMV = {"qkv": [(False, 2, 2048, 8, 1), (False, 2, 2048, 4, 1), (False, 8, 1024, 4, 1)],
        "o": [(False, 2, 2048, 4, 1), (False, 4, 2048, 8, 1)],
        "gate_up": [(False, 1, 2048, 4, 1), (False, 2, 1024, 4, 1), (False, 2, 2048, 4, 1)],
        "down": [(False, 4, 2048, 4, 1), (False, 1, 4096, 8, 1), (False, 8, 1024, 4, 1)],
        "8b-qkv": [(False, 2, 4096, 8, 1), (False, 4, 2048, 4, 1)], "8b-o": [(False, 2, 4096, 8, 1), (False, 4, 2048, 4, 1)],
        "8b-down": [(False, 2, 4096, 8, 1), (False, 4, 2048, 4, 1)]}
counters = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
table = L.packaged()


def timed(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    res = []
    for _ in range(5):
        for _ in range(3): g.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(30): g.replay()
        e1.record(); torch.cuda.synchronize()
        res.append(e0.elapsed_time(e1) / 30 / CHAIN * 1e3)
    return sorted(res)[2]


a = torch.empty(2 << 30, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): b.copy_(a)
torch.cuda.synchronize(); bw = 2 * a.numel() * 10 / (time.perf_counter() - t)
del a, b
print(f"copy bw {bw / 1e12:.2f} TB/s", flush=True)
for name in (sys.argv[1].split(",") if len(sys.argv) > 1 else SHAPES):
    n, k, gated = SHAPES[name]
    W = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(CHAIN)]
    U = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(CHAIN)] if gated else W
    floor = n * k * 2 * (2 if gated else 1) / bw * 1e6
    print(f"== {name} {n}x{k}{' gated' if gated else ''}: floor {floor:.2f} us", flush=True)
    for rows in (1, 5):
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        res = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)

        def call(cfg, i):
            if gated:
                return L.gate_up(x, W[i], U[i], "silu", cfg, counters=counters, dependent=True)
            return L.linear(x, W[i], None, cfg, counters=counters, dependent=True, residual=res)
        ref = call(tuple(table.pick(n, k, gated, True)), 0).float()
        for label, cfg, group in [("table", tuple(table.pick(n, k, gated, True)), 8)] + \
                [(f"gemv g{g}", c, g) for c in GEMV[name] for g in (8, 1)]:
            if rows == 1 and group == 1 and label != "table":
                continue
            L.GEMV_ROWS = group
            got = call(cfg, 0).float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            us = timed(lambda: [call(cfg, i) for i in range(CHAIN)])
            print(f"  rows {rows} {label} {cfg}: {us:.2f} us ({us / floor:.2f}x)  rel diff to table {err:.2g}", flush=True)
            L.GEMV_ROWS = 8
    W = U = None  # free the chain before the next shape
