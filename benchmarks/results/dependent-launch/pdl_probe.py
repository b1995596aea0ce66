"""Synthetic decoder-layer chains (norm, qkv, o+res, norm, gate_up, down+res) captured in one
graph, with programmatic dependent launch variants. Prints us per step and checks bitwise equality.

Ran against an uncommitted experimental form of the kernels: an int `pdl` keyword (bit 1 on, 2 the
first weight tile before the wait, 4 release right after the wait). The kept form is variant 1."""
import sys, time, torch
from specgen.gpu import linear as L, norm as N

dev = "cuda"
torch.manual_seed(0)
shape = sys.argv[1] if len(sys.argv) > 1 else "1b"
H, KV, I, layers, V = {"1b": (2048, 512, 8192, 16, 128256), "8b": (4096, 1024, 14336, 32, 128256)}[shape]
variants = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "0,1,3,5,7").split(",")]
def w(n, k):
    return (torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02)
Ws = [dict(qkv=w(H + 2 * KV, H), o=w(H, H), g=w(I, H), u=w(I, H), d=w(H, I),
           n1=torch.ones(H, device=dev, dtype=torch.bfloat16), n2=torch.ones(H, device=dev, dtype=torch.bfloat16))
      for _ in range(layers)]
head = w(V, H)
counters = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
x0 = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
floor_bytes = sum(t.numel() * 2 for d in Ws for t in d.values()) + head.numel() * 2

def step(x, pdl):
    for d in Ws:
        h = N.rms_norm(x, d["n1"], 1e-5, pdl=pdl)
        qkv = L.linear(h, d["qkv"], split_k=True, counters=counters, pdl=pdl)
        x = L.linear(qkv[:, :H], d["o"], split_k=True, counters=counters, residual=x, pdl=pdl)
        h = N.rms_norm(x, d["n2"], 1e-5, pdl=pdl)
        a = L.gate_up(h, d["g"], d["u"], "silu", split_k=True, counters=counters, pdl=pdl)
        x = L.linear(a, d["d"], split_k=True, counters=counters, residual=x, pdl=pdl)
    return L.linear(x, head, split_k=True, counters=counters, pdl=pdl)

graphs, outs = {}, {}
for v in variants:
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(x0, v)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs[v] = step(x0, v)
    graphs[v] = g
torch.cuda.synchronize()
ref = step(x0, 0)
for v in variants:
    graphs[v].replay(); torch.cuda.synchronize()
    print(f"variant {v}: equal to eager no-pdl: {torch.equal(outs[v], ref)}")
# bandwidth
a = torch.empty(2 << 30, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): b.copy_(a)
torch.cuda.synchronize(); bw = 2 * a.numel() * 10 / (time.perf_counter() - t)
del a, b
floor = floor_bytes / bw * 1e3
print(f"{shape}: weights {floor_bytes/1e9:.3f} GB, copy bw {bw/1e12:.2f} TB/s, floor {floor:.3f} ms")
res = {v: [] for v in variants}
for rep in range(5):
    for v in variants:
        g = graphs[v]
        for _ in range(5): g.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(100): g.replay()
        e1.record(); torch.cuda.synchronize()
        res[v].append(e0.elapsed_time(e1) / 100)
for v in variants:
    ms = sorted(res[v])
    print(f"{shape} variant {v}: median {ms[2]:.4f} ms  min {ms[0]:.4f}  ({ms[2]/floor:.3f}x floor)  all {[round(m,4) for m in res[v]]}")
