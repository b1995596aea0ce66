"""Where a split tiny Llama's logits part from the whole one's: per-module outputs of eager
runner forwards (whole on GPU 0, whole on GPU 1, split 0/1), with the step kernels and without."""
import sys
sys.path.insert(0, "tests")
import tempfile, torch
from pathlib import Path
from tiny_models import build_pair
from transformers import AutoModelForCausalLM
from specgen.core.settings import ModelSpec, Profile
from specgen.gpu.backend import CudaBackend
from specgen.gpu.kernels import ResolvedKernels
from specgen.gpu.runner import GraphRunner

SPLIT = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 1,
         "model.norm": 1, "lm_head": 1}
root = Path(tempfile.mkdtemp())
target, _ = build_pair(root, family="llama", noisy=0.1)
profile = Profile("d", "<d>", ModelSpec(str(target)))
for dtype in (torch.float32, torch.bfloat16):
    for plain in (False, True):
        records = {}
        for name, dmap in (("whole0", {"": 0}), ("whole1", {"": 1}), ("split", SPLIT)):
            model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype, device_map=dmap).eval()
            hf = model(torch.arange(3, 40, device=model.get_output_embeddings().weight.device)[None]).logits[0].float().cpu() if name != "split" else None
            home = torch.device("cuda", 0 if name == "whole0" else 1)
            backend = CudaBackend(home, profile)
            if plain:
                kernels = ResolvedKernels(attention=False, linear=False, rope=False, split_k=False, warp=True)
                runner = GraphRunner(model, 320, 600, kernels=kernels, workspace=backend.workspace, use_graphs=False)
            else:
                runner = backend.runner(model, model.get_output_embeddings().weight.shape[0], 600, "target")
                runner.use_graphs, runner.graphs = False, {}
            outs = {}
            mods = {f"layer{i}": l for i, l in enumerate(model.model.layers)} | {"norm": model.model.norm, "head": model.lm_head,
                    "rotary": model.model.rotary_emb, "embed": model.model.embed_tokens}
            hooks = [m.register_forward_hook(lambda m, a, o, k=k: outs.setdefault(k, (o[0] if isinstance(o, tuple) else o).detach().float().cpu().clone()))
                     for k, m in mods.items()]
            logits = runner.forward(torch.arange(3, 40, device=home)).float().cpu()
            step = runner.forward(torch.tensor([5, 6, 7], device=home)).float().cpu()
            for h in hooks: h.remove()
            records[name] = (outs, logits, step, hf)
            del runner, model, backend; torch.cuda.empty_cache()
        for a, b in (("whole0", "whole1"), ("whole1", "split")):
            oa, la, sa, _ = records[a]; ob, lb, sb, _ = records[b]
            diffs = {k: float((oa[k] - ob[k]).abs().max()) for k in oa if k in ob and oa[k].shape == ob[k].shape}
            print(dtype, "plain" if plain else "kernels", a, "vs", b, "logits", float((la - lb).abs().max()), "step", float((sa - sb).abs().max()), diffs, flush=True)
        print(dtype, "hf whole0 vs whole1", float((records["whole0"][3] - records["whole1"][3]).abs().max()), flush=True)
