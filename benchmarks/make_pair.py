"""Train a target/draft pair from the Python source installed on this machine.

No model hub is reachable where specgen is built and benchmarked, so the project makes its own
pairs, reproducibly: the corpus is the running Python's standard library (plus site-packages for
the `bench` preset), a fixed hash-chosen 1-4% of files is held out for prompts and evaluation, a
byte-level BPE tokenizer is trained on a sample, and a Llama-architecture target and draft are
trained together on the same batches (then, for the preset's `polish` fraction of the steps, the
draft alone against the frozen target). The output folder holds two ordinary Hugging Face
checkpoints, prompts.jsonl, pair.toml (a specgen profile) and report.json. docs/models.md has the
exact commands that made the shipped and benchmark pairs.

    python benchmarks/make_pair.py --preset demo --out .pairs/demo --seed 0 --minutes 2.5

Presets carry a fixed step count, so a run is repeatable given the seed; --minutes is a hard cap
(and, with --steps 0, the budget that the step count is calibrated to fill).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers

# The corpus and its held-out split live in the package: `specgen train-head` reads the same files.
from specgen.core.train.corpus import (
    PAIR_CORPORA,
    CorpusSpec,
    SourceFile,
    corpus_roots,
    is_held_out,  # noqa: F401 - tests/benchmarks/test_make_pair.py reads it here
    list_files,
    read_texts,
    split,
)

EOS = "<|endoftext|>"
PROMPT_TOKENS = 128
MIN_CONTINUATION = 128  # a prompt file must have this many tokens after the prompt
NEW_TOKENS = 128  # tokens the target generates from each prompt to measure acceptance


@dataclass(frozen=True)
class Arch:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    mlp: int
    tied: bool


@dataclass(frozen=True)
class Preset:
    vocab: int
    seq_len: int
    batch: int  # sequences per step
    steps: int  # 0 = calibrate to fill --minutes
    warmup: int
    target: Arch
    draft: Arch
    target_lr: float
    draft_lr: float
    distill: float  # weight of KL(target || draft) in the draft's loss; the rest is plain CE
    polish: float  # last fraction of the steps (budget, with --steps 0): frozen target, draft on KL
    corpus: CorpusSpec  # which files, which held out (core/train/corpus.py: train-head reads the same)
    tokenizer_bytes: int  # size of the tokenizer's training sample
    eval_tokens: int  # held-out tokens scored at the end
    max_prompts: int
    log_every: int


PRESETS = {
    "micro": Preset(
        vocab=512, seq_len=256, batch=8, steps=30, warmup=5,
        target=Arch(layers=2, hidden=64, heads=2, kv_heads=1, mlp=192, tied=True),
        draft=Arch(layers=1, hidden=32, heads=2, kv_heads=1, mlp=96, tied=True),
        target_lr=3e-3, draft_lr=3e-3, distill=0.5, polish=0.1, corpus=PAIR_CORPORA["micro"],
        tokenizer_bytes=300_000, eval_tokens=4096,
        max_prompts=8, log_every=10,
    ),
    "demo": Preset(
        vocab=4096, seq_len=512, batch=128, steps=900, warmup=100,
        target=Arch(layers=12, hidden=256, heads=4, kv_heads=2, mlp=704, tied=True),
        draft=Arch(layers=1, hidden=256, heads=4, kv_heads=2, mlp=704, tied=True),
        target_lr=1e-3, draft_lr=2e-3, distill=0.5, polish=0.0, corpus=PAIR_CORPORA["demo"],
        tokenizer_bytes=8_000_000, eval_tokens=262_144,
        max_prompts=40, log_every=100,
    ),
    "bench": Preset(
        vocab=16384, seq_len=1024, batch=32, steps=1875, warmup=200,
        target=Arch(layers=12, hidden=768, heads=12, kv_heads=4, mlp=2048, tied=False),
        draft=Arch(layers=2, hidden=512, heads=8, kv_heads=4, mlp=1408, tied=True),
        target_lr=4e-4, draft_lr=2e-3, distill=0.5, polish=0.2, corpus=PAIR_CORPORA["bench"],
        tokenizer_bytes=32_000_000, eval_tokens=524_288,
        max_prompts=64, log_every=100,
    ),
}


class Log:
    """Prints to stdout and writes the same lines to OUT/train.log."""

    def __init__(self, path: Path):
        self.file = path.open("w", encoding="utf-8")
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        line = f"[{time.perf_counter() - self.start:7.1f}s] {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def first_bytes(texts: list[str], cap: int) -> list[str]:
    """The leading texts (in the hash order of their files) that add up to `cap` characters."""
    total = np.cumsum([len(t) for t in texts])
    return texts[: int(np.searchsorted(total, cap)) + 1]


def encode_files(tokenizer, texts: list[str]) -> list[np.ndarray]:
    ids = []
    for start in range(0, len(texts), 4096):
        for enc in tokenizer.encode_batch(texts[start : start + 4096], add_special_tokens=False):
            ids.append(np.asarray(enc.ids, dtype=np.int32))
    return ids


def join_with_eos(docs: list[np.ndarray], eos_id: int) -> np.ndarray:
    """One stream: each file's tokens followed by EOS, as during training."""
    eos = np.array([eos_id], dtype=np.int32)
    return np.concatenate([part for doc in docs for part in (doc, eos)])


def save_tokenizer(tokenizer, folder: Path, seq_len: int) -> None:
    """tokenizer.json plus a config that AutoTokenizer reads offline (transformers 4.46 and 5)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": seq_len,
        "clean_up_tokenization_spaces": False,  # code: " ." and " ," must survive decoding
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# ---------------------------------------------------------------- models


def build_model(arch: Arch, preset: Preset, eos_id: int, seed: int):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=preset.vocab,
        hidden_size=arch.hidden,
        intermediate_size=arch.mlp,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        max_position_embeddings=preset.seq_len,
        tie_word_embeddings=arch.tied,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id
    )
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model, lr: float, device: torch.device):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup, then cosine down to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- training


class Batches:
    """Fixed-length windows of the packed token stream, in a seeded random order per epoch."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch: int, seed: int, device):
        self.tokens = torch.from_numpy(stream).to(device)
        self.starts = torch.arange(0, len(stream) - seq_len - 1, seq_len)
        assert len(self.starts) >= batch, "corpus too small for one batch"
        self.offsets = torch.arange(seq_len + 1, device=device)
        self.batch, self.device = batch, device
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.pos, self.epoch = torch.empty(0, dtype=torch.long), 0, 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pos + self.batch > len(self.order):
            self.order = self.starts[torch.randperm(len(self.starts), generator=self.generator)]
            self.pos, self.epoch = 0, self.epoch + 1
        starts = self.order[self.pos : self.pos + self.batch].to(self.device)
        self.pos += self.batch
        window = self.tokens[starts[:, None] + self.offsets].long()  # [B, T+1]
        return window[:, :-1], window[:, 1:]


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


POLISH_PEAK = 0.3  # the polish phase's peak lr, as a fraction of the draft's


def train(pair, batches: Batches, heldout: np.ndarray, preset: Preset, args, log: Log) -> dict:
    """Train target and draft on the same batches, then (preset.polish > 0) the draft alone
    against the frozen target; returns step counts and final losses."""
    device = batches.device
    peak = [preset.target_lr, preset.draft_lr]
    opts = [make_optimizer(model, lr, device) for model, lr in zip(pair, peak)]
    for model in pair:
        model.train()
    total = args.steps if args.steps is not None else preset.steps
    calibrating = total == 0
    assert 0 <= preset.polish < 1, "polish is a fraction of the training"
    polish_steps = min(round(preset.polish * total), max(0, total - 1))
    joint = total - polish_steps  # the joint phase's cosine ends here, before the polish
    budget, calibrate_at, t10 = args.minutes * 60, max(20, min(60, preset.warmup)), 0.0
    # With a polish phase the joint one stops at its share of the time cap, so that a slow
    # machine still polishes; without one this is the cap itself, as before.
    joint_cap = budget * (1 - preset.polish)
    sums = torch.zeros(2, device=device)
    recent, step, t0 = [], 0, time.perf_counter()
    while (calibrating and joint == 0) or step < joint:
        factor = lr_factor(step, preset.warmup, max(joint, step + 1))
        x, y = batches.next()  # [B, T]
        for opt, lr in zip(opts, peak):
            for group in opt.param_groups:
                group["lr"] = lr * factor
        teacher = None
        for i, (model, opt) in enumerate(zip(pair, opts)):
            with autocast(device):
                logits = model(input_ids=x, use_cache=False).logits.float()  # [B, T, V]
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            total_loss = loss if teacher is None else distill_loss(loss, logits, teacher, preset)
            total_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sums[i] += loss.detach()
            teacher = logits.detach()
        step += 1
        if total == 0 and step == 10:
            t10 = synced_clock(device)
        if total == 0 and step == calibrate_at:
            total = calibrated_steps(step, t0, t10, budget, device, log)
            polish_steps = round(preset.polish * total)
            joint = max(total - polish_steps, step + 1)
            if polish_steps:
                log(f"joint phase: {joint} steps, then polish in the rest of the budget")
        over_time = time.perf_counter() - t0 > joint_cap
        if step % preset.log_every == 0 or step == joint or over_time:
            recent = (sums / ((step - 1) % preset.log_every + 1)).tolist()
            sums.zero_()
            log(f"step {step}/{total} epoch {batches.epoch} "
                f"tokens {step * preset.batch * preset.seq_len / 1e6:.1f}M lr×{factor:.3f} "
                f"loss target {recent[0]:.3f} draft {recent[1]:.3f}")
        if step % (5 * preset.log_every) == 0:
            probe(pair, heldout, preset, device, log)
        if over_time:
            if preset.polish:
                log(f"joint phase's share of the time cap ({joint_cap:.0f} s of "
                    f"{args.minutes} min) reached at step {step} of {joint}")
            else:
                log(f"time cap of {args.minutes} min reached at step {step} of {total}")
            break
    joint_steps = step
    polished = polish(pair, opts[1], batches, heldout, preset, log, step=step,
                      steps=polish_steps, calibrating=calibrating, t0=t0, budget=budget,
                      minutes=args.minutes)
    step += polished["steps"]
    seconds = time.perf_counter() - t0
    return {"steps": step, "planned_steps": joint + polished["planned_steps"],
            "train_seconds": round(seconds, 1),
            "tokens_seen": step * preset.batch * preset.seq_len, "epochs": batches.epoch,
            "train_loss": {"target": round(recent[0], 4), "draft": round(recent[1], 4)},
            "polish": {"fraction": preset.polish, "after_step": joint_steps, **polished}}


def polish(pair, opt, batches: Batches, heldout: np.ndarray, preset: Preset, log: Log, *,
           step: int, steps: int, calibrating: bool, t0: float, budget: float,
           minutes: float) -> dict:
    """The draft alone on KL(p_target || q_draft) against the final, frozen target: in the joint
    phase it chased a teacher that kept moving, and CE pulled it toward the text as well.

    Its lr restarts: a short warmup to POLISH_PEAK of the draft's peak, then cosine to 10% of
    that. The joint cosine has left the draft at 10% of its peak, too little to move it to the
    new optimum (another objective, a teacher that has moved on) in a few hundred steps, while
    the full peak would undo an annealing that this short phase could not redo.
    With --steps 0 the phase has the rest of the budget: its steps are recalibrated after a few,
    since a step without the target's backward is cheaper."""
    device = batches.device
    done = {"steps": 0, "planned_steps": steps, "seconds": 0.0}
    if steps <= 0:
        return done
    target, draft = pair
    target.eval()
    target.requires_grad_(False)
    warmup, calibrate_at, t_mark = max(1, steps // 10), 12, 0.0
    log(f"polish: target frozen after step {step}; the draft alone on KL(target || draft) for "
        f"{steps} steps, lr restarting at {POLISH_PEAK:g} × {preset.draft_lr:g}")
    sums, count, recent = torch.zeros(3, device=device), 0, [math.nan] * 3
    i, t_start = 0, time.perf_counter()
    while i < steps:
        settled = not calibrating or i >= calibrate_at  # until then, hold the peak after warmup
        factor = POLISH_PEAK * lr_factor(i, warmup, steps if settled else 10**9)
        for group in opt.param_groups:
            group["lr"] = preset.draft_lr * factor
        x, y = batches.next()  # [B, T]
        with torch.no_grad(), autocast(device):
            teacher = target(input_ids=x, use_cache=False).logits.float()  # [B, T, V]
        with autocast(device):
            logits = draft(input_ids=x, use_cache=False).logits.float()  # [B, T, V]
        kl = kl_to_teacher(logits, teacher)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            sums += torch.stack([F.cross_entropy(teacher.flatten(0, 1), y.flatten()),
                                 F.cross_entropy(logits.flatten(0, 1), y.flatten()), kl])
        count, i, step = count + 1, i + 1, step + 1
        if calibrating and i == 2:
            t_mark = synced_clock(device)
        if calibrating and i == calibrate_at:
            now = synced_clock(device)
            per_step = (now - t_mark) / (i - 2)
            steps = max(i + 1, i + int((0.97 * budget - (now - t0)) / per_step))
            log(f"polish calibrated: {per_step * 1e3:.1f} ms/step -> {steps} polish steps")
        over_time = time.perf_counter() - t0 > budget
        if step % preset.log_every == 0 or i == steps or over_time:
            recent = (sums / count).tolist()
            sums.zero_()
            count = 0
            log(f"polish step {i}/{steps} (step {step}) epoch {batches.epoch} "
                f"lr×{factor:.3f} KL(target || draft) {recent[2]:.3f}; "
                f"CE target {recent[0]:.3f} draft {recent[1]:.3f}")
        if step % (5 * preset.log_every) == 0:
            probe(pair, heldout, preset, device, log)
        if over_time:
            log(f"time cap of {minutes} min reached at polish step {i} of {steps}")
            break
    target.requires_grad_(True)
    return {"steps": i, "planned_steps": steps,
            "seconds": round(time.perf_counter() - t_start, 1),
            "train_kl": round(recent[2], 4), "train_loss_draft": round(recent[1], 4)}


def kl_to_teacher(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(p || q), the mean over positions; p from the teacher's logits, q from the draft's."""
    log_q = F.log_softmax(logits.flatten(0, 1), dim=-1)  # [B*T, V]
    log_p = F.log_softmax(teacher.flatten(0, 1), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def distill_loss(ce: torch.Tensor, logits: torch.Tensor, teacher: torch.Tensor, preset: Preset):
    """The draft learns the labels and the target's current distribution: its argmax is what
    speculation needs to match, and KL(p || q) pulls q toward p where p puts its mass."""
    if preset.distill == 0:
        return ce
    kl = kl_to_teacher(logits, teacher)
    return (1 - preset.distill) * ce + preset.distill * kl


def synced_clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def calibrated_steps(step: int, t0: float, t10: float, budget: float, device, log: Log) -> int:
    """Steps that fill 97% of the budget at the rate of steps 10..now (past the slow first ones)."""
    now = synced_clock(device)
    per_step = (now - t10) / (step - 10)
    total = step + int((0.97 * budget - (now - t0)) / per_step)
    log(f"calibrated: {per_step * 1e3:.1f} ms/step -> {total} steps in {budget / 60:.2f} min")
    return max(total, step + 1)


@torch.no_grad()
def evaluate(pair, stream: np.ndarray, preset: Preset, device) -> dict:
    """Held-out loss of both, and how often the draft's argmax equals the target's."""
    for model in pair:
        model.eval()
    t = preset.seq_len
    n = min(len(stream) - 1, preset.eval_tokens) // t
    windows = torch.from_numpy(stream[: n * t + 1])
    loss, agree, count = torch.zeros(2, dtype=torch.float64), 0, 0
    for start in range(0, n, preset.batch):
        rows = range(start, min(n, start + preset.batch))
        batch = torch.stack([windows[r * t : r * t + t + 1] for r in rows]).long().to(device)
        x, y = batch[:, :-1], batch[:, 1:]  # [B, T]
        argmax = []
        for i, model in enumerate(pair):
            with autocast(device):
                logits = model(input_ids=x, use_cache=False).logits.float()  # [B, T, V]
            loss[i] += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            argmax.append(logits.argmax(-1))
        agree += (argmax[0] == argmax[1]).sum().item()
        count += y.numel()
    return {"heldout_tokens": count,
            "heldout_loss": {"target": round(loss[0].item() / count, 4),
                             "draft": round(loss[1].item() / count, 4)},
            "greedy_agreement": round(agree / count, 4)}


@torch.no_grad()
def generated_agreement(pair, prompts: list[np.ndarray], eos_id: int, device) -> dict:
    """How often the draft's argmax is the token the target generates greedily from a held-out
    prompt: the acceptance rate of greedy speculative decoding with this pair. Positions after
    a generated EOS are not counted."""
    target, draft = pair
    for model in pair:
        model.eval()
    seqs = torch.from_numpy(np.stack([ids[:PROMPT_TOKENS] for ids in prompts])).long().to(device)
    for _ in range(NEW_TOKENS):
        with autocast(device):
            logits = target(input_ids=seqs, use_cache=False, logits_to_keep=1).logits  # [N, 1, V]
        seqs = torch.cat([seqs, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # [N, P+i+1]
    with autocast(device):
        logits = draft(input_ids=seqs[:, :-1], use_cache=False).logits  # [N, P+G-1, V]
    guesses = logits[:, PROMPT_TOKENS - 1 :].argmax(-1)  # [N, G]
    generated = seqs[:, PROMPT_TOKENS:]  # [N, G]
    is_eos = (generated == eos_id).long()
    counted = (is_eos.cumsum(1) - is_eos) == 0  # up to and including the first EOS
    agree = ((guesses == generated) & counted).sum().item()
    return {"generated_agreement": round(agree / counted.sum().item(), 4),
            "generated_tokens": counted.sum().item()}


def probe(pair, heldout: np.ndarray, preset: Preset, device, log: Log) -> None:
    """One batch of held-out text, to see overfitting while it happens."""
    modes = [model.training for model in pair]  # the polish phase keeps the target in eval
    probe_preset = dataclasses.replace(preset, eval_tokens=preset.batch * preset.seq_len)
    scores = evaluate(pair, heldout, probe_preset, device)
    loss = scores["heldout_loss"]
    log(f"  held-out probe: loss target {loss['target']:.3f} draft {loss['draft']:.3f}, "
        f"agreement {scores['greedy_agreement']:.3f}")
    for model, mode in zip(pair, modes):
        model.train(mode)


# ---------------------------------------------------------------- output


def prompt_files(heldout: list[tuple[SourceFile, np.ndarray]], cap: int):
    """Held-out files with room for a prompt and its continuation, in hash order, at most cap."""
    return [(f, ids) for f, ids in heldout if len(ids) >= PROMPT_TOKENS + MIN_CONTINUATION][:cap]


def write_prompts(path: Path, prompts: list[tuple[SourceFile, np.ndarray]], tokenizer) -> None:
    """The first 128 tokens of each prompt file, decoded, one JSON object a line."""
    with path.open("w", encoding="utf-8") as out:
        for file, ids in prompts:
            prompt = tokenizer.decode(ids[:PROMPT_TOKENS].tolist())
            out.write(json.dumps({"prompt": prompt, "source": file.source}) + "\n")


PAIR_TOML = """\
# A pair made by benchmarks/make_pair.py; paths are relative to this file.
name = "{name}"
description = "Trained on Python source: make_pair.py --preset {preset} --seed {seed}"

[target]
path = "./target"

[draft]
path = "./draft"

[speculation]
k = 4

[sampling]
temperature = 0.0
max_tokens = 128
"""


def save_pair(pair, tokenizer, out: Path, preset: Preset) -> dict:
    sizes = {}
    for name, model in zip(("target", "draft"), pair):
        folder = out / name
        model.to(torch.bfloat16).save_pretrained(folder)
        save_tokenizer(tokenizer, folder, preset.seq_len)
        sizes[name] = sum(f.stat().st_size for f in folder.iterdir())
    return sizes


def arch_report(arch: Arch, model, size: int) -> dict:
    return {**dataclasses.asdict(arch), "params": n_params(model), "folder_bytes": size}


# ---------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=5.0, help="training time cap")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the preset's; 0 = fill --minutes)")
    parser.add_argument("--polish", type=float, default=None,
                        help="fraction of the steps for the draft alone against the frozen "
                             "target (default: the preset's; 0 = none)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--stdlib", type=Path, default=None,
                        help="standard library folder to read instead of the running Python's")
    return parser.parse_args(argv)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_data(preset: Preset, stdlib: Path | None, log: Log):
    """Tokenizer, training stream, held-out (file, ids) pairs in hash order, corpus counts."""
    files = list_files(corpus_roots(preset.corpus.site_packages, stdlib))
    train_files, held = split(files, preset.corpus.holdout_mod)
    train_texts = [text for _, text in read_texts(train_files, preset.corpus.train_bytes)]
    heldout_texts = read_texts(held, None)
    log(f"corpus: {len(files)} files; training on {len(train_texts)} "
        f"({sum(map(len, train_texts)) / 1e6:.1f} MB), {len(heldout_texts)} held out")
    tokenizer = train_tokenizer(first_bytes(train_texts, preset.tokenizer_bytes), preset.vocab)
    train_stream = join_with_eos(encode_files(tokenizer, train_texts), tokenizer.token_to_id(EOS))
    heldout_ids = encode_files(tokenizer, [text for _, text in heldout_texts])
    heldout = sorted(zip((file for file, _ in heldout_texts), heldout_ids), key=lambda h: h[0].key)
    counts = {"files": len(files), "train_files": len(train_texts),
              "heldout_files": len(heldout), "train_tokens": len(train_stream),
              "holdout_rule": preset.corpus.holdout_rule}
    log(f"tokenizer: vocab {tokenizer.get_vocab_size()}; {len(train_stream) / 1e6:.2f}M training "
        f"tokens, {sum(map(len, heldout_ids)) / 1e3:.1f}k held out")
    return tokenizer, train_stream, heldout, counts


def main(argv=None) -> dict:
    args = parse_args(argv)
    preset, device, wall = PRESETS[args.preset], torch.device(args.device), time.perf_counter()
    if args.polish is not None:
        preset = dataclasses.replace(preset, polish=args.polish)
    args.out.mkdir(parents=True, exist_ok=True)
    transformers.logging.disable_progress_bar()
    log = Log(args.out / "train.log")
    log(f"make_pair {shlex.join(sys.argv[1:])} on {device_name(device)}")
    seed_everything(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    tokenizer, train_stream, heldout, counts = prepare_data(preset, args.stdlib, log)
    eos_id = tokenizer.token_to_id(EOS)
    heldout_stream = join_with_eos([ids for _, ids in heldout], eos_id)
    archs = (preset.target, preset.draft)
    pair = [build_model(a, preset, eos_id, args.seed + i).to(device) for i, a in enumerate(archs)]
    log(f"params: target {n_params(pair[0]) / 1e6:.2f}M, draft {n_params(pair[1]) / 1e6:.2f}M")
    batches = Batches(train_stream, preset.seq_len, preset.batch, args.seed, device)
    trained = train(pair, batches, heldout_stream, preset, args, log)
    prompts = prompt_files(heldout, preset.max_prompts)
    scores = evaluate(pair, heldout_stream, preset, device)
    scores.update(generated_agreement(pair, [ids for _, ids in prompts], eos_id, device))
    log(f"held-out loss target {scores['heldout_loss']['target']:.3f} "
        f"draft {scores['heldout_loss']['draft']:.3f}; greedy agreement "
        f"{scores['greedy_agreement']:.3f} on held-out text, "
        f"{scores['generated_agreement']:.3f} on the target's greedy continuations "
        f"of {len(prompts)} prompts")

    sizes = save_pair(pair, tokenizer, args.out, preset)
    write_prompts(args.out / "prompts.jsonl", prompts, tokenizer)
    toml = PAIR_TOML.format(name=f"{args.preset}-pair", preset=args.preset, seed=args.seed)
    (args.out / "pair.toml").write_text(toml)
    report = {
        "preset": args.preset, "seed": args.seed,
        "command": shlex.join(["python", "benchmarks/make_pair.py", *sys.argv[1:]]),
        **versions(), "device": device_name(device), "corpus": counts,
        "vocab": tokenizer.get_vocab_size(), "seq_len": preset.seq_len, "batch": preset.batch,
        "target": arch_report(preset.target, pair[0], sizes["target"]),
        "draft": arch_report(preset.draft, pair[1], sizes["draft"]),
        **trained, **scores, "prompts": len(prompts),
        "wall_seconds": round(time.perf_counter() - wall, 1),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"saved {args.out}: target {sizes['target'] / 1e6:.1f} MB, "
        f"draft {sizes['draft'] / 1e6:.1f} MB, {len(prompts)} prompts; "
        f"{report['wall_seconds']:.0f} s in all")
    return report


def versions() -> dict:
    import tokenizers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


if __name__ == "__main__":
    main()
