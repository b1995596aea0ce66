"""Coordinate descent of a draft's matrix-vector picks inside the captured Llama-3.2-1B step, then
attention launch knobs. Every candidate alternates with the current best."""
import dataclasses, os, statistics, sys, time
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from specgen.gpu import attention, rewire
from specgen.gpu.linear_table import LinearTable
from specgen.gpu.kernels import resolve
from specgen.gpu.runner import GraphRunner
from specgen.gpu.workspace import Workspace

MODEL = os.environ.get("MODEL", "1b")
cfg = bk.MODELS[MODEL]
model = bk.random_llama(cfg)
width = cfg["vocab_size"]
ws = Workspace("cuda")
base = resolve(dataclasses.replace(bk.SPEC, **bk.VARIANTS["graph-draft"][1]), "cuda", model)
table = base.linear_table.for_drafts()
h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
hd = h // cfg["num_attention_heads"]; kv = cfg["num_key_value_heads"] * hd
SHAPES = {"qkv": (h + 2 * kv, h, False), "o": (h, h, False), "gu": (i, h, True), "down": (h, i, False), "head": (v, h, False)}
cur = {s: table.pick(*SHAPES[s], True, 1) for s in SHAPES}
print("start picks:", cur, flush=True)
SPLIT, COMBINE = attention._split_kernel, attention._combine_kernel

class Launch:  # a kernel whose launches take other keywords
    def __init__(self, kern, **over): self.kern, self.over = kern, over
    def __getitem__(self, grid):
        run = self.kern[grid]
        return lambda *a, **kw: run(*a, **{**kw, **self.over})

def build(picks, att=None):
    att = att or {}
    attention._split_kernel = Launch(SPLIT, num_warps=att["split_warps"]) if "split_warps" in att else SPLIT
    attention._combine_kernel = Launch(COMBINE, num_warps=att["merge_warps"]) if "merge_warps" in att else COMBINE
    attention.SPLIT_KEYS = att.get("split_keys", 64)
    d = dict(table.drafts); d.update({SHAPES[s]: c for s, c in picks.items()})
    k = dataclasses.replace(base, linear_table=LinearTable(table.entries, "exp", tuple(sorted(d.items())), for_draft=True))
    r = GraphRunner(model, width, 1024, kernels=k, workspace=ws)
    rewire.install_norm(model, r.switch)
    with r.switch.engaged(k.split_k, r.counters, norm=True):
        r.add_shapes((1,))
    return r

def measure(picks, att=None):
    r = build(picks, att)
    ms = bk.step_seconds(r, 1) * 1e3
    del r
    return ms

deadline = time.time() + float(os.environ.get("BUDGET", "480"))
start_ms = [measure(cur)]
head_picks = dict(cur)

def compare(label, cand_picks, cand_att, cur_att, n):
    a, b = [], []
    for _ in range(n):
        a.append(measure(cand_picks, cand_att)); b.append(measure(cur, cur_att))
    return statistics.median(a), statistics.median(b)

for s in ["qkv", "gu", "o", "down", "head"]:
    n_, k_, gated = SHAPES[s]
    pieces = [p for p in (512, 1024, 2048, 4096) if p <= k_]
    cands = [(False, bn, p, w, 1) for bn in (1, 2, 4, 8) for p in pieces for w in (4, 8)
             if (False, bn, p, w, 1) != cur[s] and bn * p <= (8192 if not gated else 4096)]
    scores = []
    for c in cands:
        if time.time() > deadline: break
        try:
            a, b = compare(s, {**cur, s: c}, None, None, 1)
        except Exception as e:
            print(f"{s} {c} failed: {type(e).__name__}: {str(e)[:100]}", flush=True); continue
        scores.append((a - b, c)); print(f"{s} {c} {a:.4f} vs {b:.4f}", flush=True)
    scores.sort()
    for diff, c in scores[:3]:
        if diff > -0.002 or time.time() > deadline: break
        a, b = compare(s, {**cur, s: c}, None, None, 3)
        print(f"{s} confirm {c} {a:.4f} vs {b:.4f}", flush=True)
        if a < b - 0.003:
            cur[s] = c; print(f"{s} -> {c}", flush=True); break

att = {}
for knob, values in (("split_warps", (2, 8)), ("merge_warps", (1, 2, 8)), ("split_keys", (128, 256))):
    for val in values:
        if time.time() > deadline: break
        a, b = compare(knob, cur, {**att, knob: val}, att, 3)
        print(f"{knob}={val} {a:.4f} vs {b:.4f}", flush=True)
        if a < b - 0.003:
            att[knob] = val; print(f"{knob} -> {val}", flush=True)

print("\nfinal picks:", cur, "attention:", att, flush=True)
fin, hd_ = [], []
for _ in range(3):
    fin.append(measure(cur, att)); hd_.append(measure(head_picks))
print(f"head {statistics.median(hd_):.4f} {hd_}  final {statistics.median(fin):.4f} {fin}", flush=True)
