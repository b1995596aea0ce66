"""One EAGLE-3 head step at Llama 3.1 8B's shape (random weights), captured as the round runs it
(the step kernels, split-K off and on), timed over replays; then the profiler's kernel table."""
import torch
from specgen.core.eagle import Eagle3Config, Eagle3Head
from specgen.gpu.kernels import ResolvedKernels
from specgen.gpu.linear import split_k_counters
from specgen.gpu.rewire_head import install_head
from specgen.gpu.workspace import Workspace

dev, dt = torch.device("cuda"), torch.bfloat16
config = Eagle3Config(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0, target_vocab_size=128256,
                      draft_vocab_size=32000, target_hidden_size=4096, aux_layer_ids=(2, 16, 29),
                      max_position_embeddings=4096)
torch.manual_seed(0)
head = Eagle3Head(config, torch.randn(128256, 4096, device=dev, dtype=dt) * 0.02, capacity=1).to(dev, dt)
with torch.no_grad():
    for p in head.parameters():
        p.normal_(0, 0.02)
    head.d2t.copy_(torch.randperm(128256, device=dev)[:32000].sort().values - torch.arange(32000, device=dev))
head.reserve(1024)
kernels = ResolvedKernels(attention=True, linear=True, rope=True, split_k=True, warp=True, norm=True, head=True, step_io=True)
switch = install_head(head, kernels)
counters = split_k_counters(Workspace(dev))
ids = torch.zeros(1, dtype=torch.long, device=dev)
hidden = torch.randn(1, 4096, device=dev, dtype=dt)
positions = torch.full((1,), 512, dtype=torch.long, device=dev)
width = 128256
columns = torch.arange(32000, device=dev) + head.d2t


def call(split):
    with switch.engaged(split, counters if split else None, norm=True):
        logits, out = head.forward(ids, hidden, positions, None, False)
    full = logits.new_full((1, width), float("-inf"), dtype=torch.float32)
    return full.index_copy_(1, columns, logits.float()), out


def capture(fn, n=1):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.inference_mode():
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.inference_mode():
        for _ in range(n): fn()
    return g


def timed(g, n=50):
    for _ in range(5): g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n): g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / n * 1e3


graphs = {split: capture(lambda split=split: call(split), 4) for split in (False, True)}
weights = sum(p.numel() for n, p in head.named_parameters() if not n.startswith("fc.")) * 2
print(f"weights a call {weights / 1e6:.1f} MB")
for r in range(3):
    print("4 calls: split-K off %.1f us, on %.1f us" % (timed(graphs[False]) , timed(graphs[True])), flush=True)
import sys
for split in (() if "--no-profile" in sys.argv else (False, True)):
    g = capture(lambda split=split: call(split), 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20): g.replay()
        torch.cuda.synchronize()
    print(f"== split {split}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
