set -x
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
python3 - <<'PY' 2>&1 | tail -20 | tee $OUT/compile_check.txt
import torch, triton
from specgen.gpu import linear as L
print("triton", triton.__version__, "torch", torch.__version__)
import torch._inductor.config as c
print("inductor enable_pdl:", getattr(c.triton, "enable_pdl", "absent"))
print("pdl on:", L.pdl(torch.device("cuda")))
x = torch.randn(5, 4096, device="cuda", dtype=torch.bfloat16); w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)/64
ref = torch.nn.functional.linear(x, w)
got = L.linear(x, w)
print("eager err", ((got.float()-ref.float()).abs().max()/ref.float().abs().max()).item())
try:
    f = torch.compile(lambda a, b: L.linear(a, b) * 2, fullgraph=True)
    y = f(x, w)
    print("compile ok, err", ((y.float()/2-ref.float()).abs().max()/ref.float().abs().max()).item())
except Exception as e:
    print("compile FAILED:", type(e).__name__, str(e)[:800])
PY
timeout 200 python3 benchmarks/bench_linear.py --pdl --rows 1,5 --shapes q_o,qkv,gate_up,down,lm_head,bench_qkv,bench_o,bench_gate_up,bench_down,bench_lm_head --out $OUT/bench_linear_pdl.json 2>&1 | grep -v Warning | tail -30 > $OUT/bench_linear_pdl.txt
cat $OUT/bench_linear_pdl.txt
timeout 300 python3 benchmarks/bench_shapes.py --variants graph-linear-nopdl,graph-linear,compile-linear-nopdl,compile-linear --out $OUT/shapes_pdl.json 2>&1 | grep -v Warn | tail -20 | tee $OUT/shapes_pdl.txt
