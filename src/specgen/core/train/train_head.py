"""Training an EAGLE-3 head for a target in one process: `specgen train-head` (issue 21).

The target is frozen (eval mode, no gradients). Each step runs it once over a batch of token
windows; forward pre-hooks on the chosen decoder layers capture the residual stream entering
them (the aux states: transformers' `output_hidden_states[i]`), and its logits give the
distribution the head learns, so no server and no files of hidden states are involved.

Training-time test (TTT, EAGLE-3): the head is unrolled `ttt_steps` times over every position,
as it drafts at inference (core/drafters/eagle.py: row t sits at position t, embeds x[t+1], reads
fc(aux at t) and predicts x[t+2]). Row c of step s is step s of the chain that starts at target
row c: it sits at position c + s, embeds x[c+s+1], reads the chain's own output hidden state of
step s-1 (step 0: fc(aux at c)) and predicts x[c+s+2]. It attends to every target row at a
position <= c and to the chain's own rows of steps 1..s, which is what the head's cache holds
when it drafts step s at inference (tests/core/train/test_train_head.py checks the two against each other).
The ids of later steps are the data's, not the head's own guesses: a chain only matters at
inference while its guesses equal the target's tokens.

Loss: EAGLE-3's soft cross-entropy against the target's next-token distribution restricted to
the draft vocabulary (softmax of the target's logits at those ids), at the positions where the
target's own choice is in the draft vocabulary, with step s weighted 0.8^s.

Simulated acceptance length at k: on the target's greedy continuations of held-out prompts, the
tokens a round would emit if the head drafted greedily against the target's greedy choices,
1 + sum over j <= k of prod over i <= j of [draft i equals the target's choice], averaged over
every start position of the continuations.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.core.train.corpus import Data
from specgen.core.drafters.eagle import Eagle3Config, Eagle3Head, rotate
from specgen.core.drafters import head_folder
from specgen.core.errors import ModelError
from specgen.core.train.head_data import (
    EVAL_PROMPT_TOKENS,
    Windows,
    draft_vocabulary,
    eval_prompts,
)
from specgen.core.train.train_plan import EVAL_K, SHOWN_K, TrainPlan

STEP_WEIGHT = 0.8  # EAGLE-3's weight of the loss of TTT step s: 0.8^s
EVAL_NEW_TOKENS = 96
REGEN_PROMPT_FRACTION = 0.25  # --regenerate: a quarter of each window is the data's prompt
REGEN_TEMPERATURE = 0.8
REGEN_POOL = 8  # --regenerate: batches continued together


# ---------------------------------------------------------------- the target's hidden states


def decoder_layers(target) -> torch.nn.ModuleList:
    """The target's decoder layers: `model.layers` in transformers' Llama-family models and in
    specgen's own (core/step/)."""
    try:
        layers = target.model.layers
    except AttributeError:
        raise ModelError(f"train-head reads hidden states from `model.layers`, which {type(target).__name__} "
                         "does not have", hint="use a Llama-family target (Llama, Mistral, Qwen, ...)") from None
    return layers


class AuxCapture:
    """Forward pre-hooks that keep the hidden state entering each chosen decoder layer."""

    def __init__(self, target, layer_ids: tuple[int, ...]):
        self.layer_ids = layer_ids
        self.states: dict[int, torch.Tensor] = {}
        layers = decoder_layers(target)
        self.handles = [layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)
                        for i in dict.fromkeys(layer_ids)]

    def _hook(self, index: int):
        def keep(module, args, kwargs):
            self.states[index] = args[0] if args else kwargs["hidden_states"]
        return keep

    def aux(self) -> torch.Tensor:
        """[B, T, 3 * hidden]: the captured states, low to high, concatenated."""
        return torch.cat([self.states[i] for i in self.layer_ids], dim=-1)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class TargetBatch:
    """What the head learns from, for a batch of token windows [B, T]."""

    ids: torch.Tensor  # [B, T]
    aux: torch.Tensor  # [B, T, 3 * target hidden]
    teacher: torch.Tensor  # [B, T, Vd] float32: the target's logits at the draft vocabulary's ids
    choice: torch.Tensor  # [B, T] the target's greedy choice (target ids) at each position


@torch.no_grad()
def run_target(target, capture: AuxCapture, ids: torch.Tensor, draft_ids: torch.Tensor) -> TargetBatch:
    logits = target(input_ids=ids, use_cache=False).logits  # [B, T, V]
    return TargetBatch(ids, capture.aux(), logits[..., draft_ids].float(), logits.argmax(-1))


# ---------------------------------------------------------------- the head, unrolled


def attend(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """q [B, H, T, D]; keys[0], values[0] [B, H, T, D] are the target rows (row c sees rows <= c);
    keys[i], values[i] (i >= 1) the chains' own rows of step i (row c sees only its own)."""
    t = q.shape[2]
    scale = q.shape[-1] ** -0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]  # [B, H, T, T]
    scores += [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]  # [B, H, T, 1] each
    weights = torch.cat(scores, dim=-1).float().softmax(-1).to(q.dtype)  # [B, H, T, T + s]
    out = weights[..., :t] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + weights[..., t + i, None] * v
    return out


def layer_step(layer, embeds: torch.Tensor, h: torch.Tensor, rope, keys: list, values: list) -> torch.Tensor:
    """Eagle3Layer.forward for a batch [B, T, ...] of one TTT step; appends the step's keys and
    values to `keys` and `values` (the training-time stand-in for the head's cache)."""
    normed = layer.hidden_norm(h)
    residual = normed if layer.norm_before_residual else h
    x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
    attn = layer.self_attn
    b, t, _ = x.shape
    q = rotate(attn.q_proj(x).view(b, t, attn.heads, attn.head_dim), *rope)
    k = rotate(attn.k_proj(x).view(b, t, attn.kv_heads, attn.head_dim), *rope)
    v = attn.v_proj(x).view(b, t, attn.kv_heads, attn.head_dim)
    group = attn.heads // attn.kv_heads
    keys.append(k.repeat_interleave(group, dim=2).transpose(1, 2))  # [B, H, T, D]
    values.append(v.repeat_interleave(group, dim=2).transpose(1, 2))
    out = attend(q.transpose(1, 2), keys, values).transpose(1, 2).reshape(b, t, attn.heads * attn.head_dim)
    h = residual + attn.o_proj(out)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def shifted(x: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """x[:, by:] padded at the end to x's length (dim 1)."""
    if by == 0:
        return x
    pad = x.new_full((x.shape[0], by, *x.shape[2:]), fill)
    return torch.cat([x[:, by:], pad], dim=1)


def unroll(head: Eagle3Head, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's draft logits [B, T, Vd] for TTT steps 0..steps-1: row c of step s predicts
    x[c+s+2] (rows whose ids run past the window are padding)."""
    t = ids.shape[1]
    h = head.fuse(aux)  # [B, T, H]
    keys, values, logits = [], [], []
    for s in range(steps):
        positions = torch.arange(s, s + t, device=ids.device)
        rope = head.rotary(positions, h.dtype)  # [T, 1, D] each: broadcast over [B, T, heads, D]
        embeds = F.embedding(shifted(ids, 1 + s), head.embedding).to(h.dtype)
        h = layer_step(head.layers[0], embeds, h, rope, keys, values)
        logits.append(head.lm_head(head.norm(h)))
    return logits


def ttt_loss(head: Eagle3Head, batch: TargetBatch, steps: int) -> torch.Tensor:
    """The weighted soft cross-entropy of steps 0..steps-1 (a scalar, weights summing to 1)."""
    logits = unroll(head, batch.ids, batch.aux, steps)
    in_vocab = head.t2d[batch.choice]  # [B, T]
    total, weights = 0.0, [STEP_WEIGHT ** s for s in range(steps)]
    for s, step_logits in enumerate(logits):
        target_p = shifted(batch.teacher, 1 + s).softmax(-1)  # [B, T, Vd]: the target at c+s+1
        mask = shifted(in_vocab, 1 + s, False)  # rows past the window are padding: False
        soft_ce = -(target_p * step_logits.float().log_softmax(-1)).sum(-1)  # [B, T]
        total = total + weights[s] * (soft_ce * mask).sum() / mask.sum().clamp(min=1)
    return total / sum(weights)


# ---------------------------------------------------------------- simulated acceptance


def acceptance_lengths(matches: torch.Tensor) -> torch.Tensor:
    """matches [N, K] bool (draft step j equals the target's choice) -> [K] the mean accepted
    length at k = 1..K: 1 + sum over j <= k of prod over i <= j of matches[:, i]."""
    runs = matches.long().cumprod(dim=1)  # [N, K]: 1 while every step so far matched
    return 1.0 + runs.float().cumsum(dim=1).mean(dim=0)


@dataclass
class EvalSet:
    """The target's greedy continuations of held-out prompts, with its states over them."""

    batch: TargetBatch  # ids [N, P + G]
    prompt_tokens: int

    @property
    def starts(self) -> range:
        """Chain start rows c whose drafts x[c+2 .. c+EVAL_K+1] are all generated tokens."""
        return range(self.prompt_tokens - 2, self.batch.ids.shape[1] - EVAL_K)


@torch.no_grad()
def head_acceptance(head: Eagle3Head, evalset: EvalSet, autocast) -> list[float]:
    """Simulated acceptance length at k = 1..EVAL_K."""
    batch = evalset.batch
    with autocast:
        logits = unroll(head, batch.ids, batch.aux, EVAL_K)
    rows = torch.tensor(evalset.starts, device=batch.ids.device)
    steps = []
    for s, step_logits in enumerate(logits):
        guess = head.to_target_ids(step_logits[:, rows].argmax(-1))  # [N, C]
        steps.append(guess == batch.choice[:, rows + 1 + s])
    return acceptance_lengths(torch.stack(steps, dim=-1).flatten(0, 1)).tolist()


@torch.no_grad()
def model_acceptance(draft, evalset: EvalSet) -> list[float]:
    """The same simulation for a draft model: its greedy step j of the chain at c reads the
    prefix up to x[c+1+j] (its own drafts, which equal the target's choices while they match)."""
    batch = evalset.batch
    guesses = draft(input_ids=batch.ids, use_cache=False).logits.argmax(-1)  # [N, L]
    rows = torch.tensor(evalset.starts, device=batch.ids.device)
    steps = [guesses[:, rows + 1 + s] == batch.choice[:, rows + 1 + s] for s in range(EVAL_K)]
    return acceptance_lengths(torch.stack(steps, dim=-1).flatten(0, 1)).tolist()


@torch.no_grad()
def continue_greedily(target, prompts: torch.Tensor, new_tokens: int, temperature: float = 0.0,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """prompts [N, P] -> [N, P + new_tokens]: the target's continuation (greedy, or sampled at
    `temperature` with `generator`), with a KV cache."""
    from specgen.core.models.loading import cache_keyword, new_cache

    cache = {cache_keyword(type(target).forward): new_cache(target)}
    seqs, step = prompts, prompts
    for _ in range(new_tokens):
        logits = target(input_ids=step, **cache, use_cache=True).logits[:, -1].float()  # [N, V]
        if temperature > 0:
            step = torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator)
        else:
            step = logits.argmax(-1, keepdim=True)
        seqs = torch.cat([seqs, step], dim=1)
    return seqs


# ---------------------------------------------------------------- building the head


def target_shape(config) -> dict:
    """The fields of a target's config (transformers', or core/step/'s StepConfig) the head copies."""
    heads = config.num_attention_heads
    rope = dict(getattr(config, "rope_parameters", None) or {})  # transformers 5; 4 had rope_theta/rope_scaling
    theta = getattr(config, "rope_theta", None) or rope.get("rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None) or (rope if rope.get("rope_type", "default") != "default" else None)
    return dict(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_attention_heads=heads, num_key_value_heads=getattr(config, "num_key_value_heads", None) or heads,
                head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)), rope_theta=float(theta),
                rope_scaling=scaling, max_position_embeddings=getattr(config, "max_position_embeddings", None) or 2048)


def build_head(target, layer_ids: tuple[int, ...], draft_ids: torch.Tensor, init_from_target: bool,
               seed: int, device: torch.device) -> Eagle3Head:
    """A new head of EAGLE-3's shape for the target: one layer as wide as the target's own, which
    embeds with the target's embedding. With init_from_target its lm_head starts as the target's
    rows of the draft vocabulary and its final norm as the target's."""
    shape = target_shape(target.config)
    vocab, hidden = target.config.vocab_size, shape["hidden_size"]
    config = Eagle3Config(**shape, target_vocab_size=vocab, draft_vocab_size=len(draft_ids),
                          target_hidden_size=hidden, aux_layer_ids=tuple(layer_ids))
    embedding = target.model.embed_tokens.weight  # transformers' Llama family and core/step/
    torch.manual_seed(seed)
    head = Eagle3Head(config, embedding.detach().float().to(device), capacity=1).to(device)
    with torch.no_grad():
        head.d2t.copy_(draft_ids.to(device) - torch.arange(len(draft_ids), device=device))
        head.t2d.zero_()
        head.t2d[draft_ids.to(device)] = True
        if init_from_target:
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids.to(device)].float())
            head.norm.weight.copy_(target.model.norm.weight.float())
    return head


# ---------------------------------------------------------------- the loop


@dataclass
class Progress:
    """What the progress bar shows, updated as the head trains."""

    step: int = 0
    loss: float = math.nan
    acceptance: list[float] = field(default_factory=list)  # at k = 1..EVAL_K, last evaluation
    elapsed: float = 0.0
    budget: float = 0.0  # seconds the loop may run
    steps: int = 0  # the plan's step count; 0 = until the budget is spent

    @property
    def remaining(self) -> float | None:
        return remaining_seconds(self.step, self.steps, self.elapsed, self.budget)


def remaining_seconds(step: int, steps: int, elapsed: float, budget: float) -> float | None:
    """Seconds the loop has left: the budget's rest, or for a step count the steps left at the
    rate measured so far (at most the budget's rest); None before a step has been measured."""
    left = max(0.0, budget - elapsed)
    if not steps:
        return left
    if step == 0:
        return None
    return min(left, (steps - step) * elapsed / step)


@dataclass
class Outcome:
    steps: int
    complete: bool  # False after Ctrl-C
    losses: list[tuple[int, float]]  # (step, mean loss of the steps since the previous entry)
    acceptance: list[float]  # the last evaluation's, at k = 1..EVAL_K
    train_seconds: float
    tokens_seen: int
    regenerated_tokens: int
    divergence: Divergence
    draft_acceptance: list[float] | None = None  # the profile's draft model's, for comparison


def lr_factor(step: int, progress: float, warmup_steps: int) -> float:
    """The learning rate of step `step` (from 0) as a share of the peak: linear warmup over the
    first `warmup_steps` steps, whatever the run's length (a share of a few slow steps would
    reach the peak at step 2), times a cosine from 1 down to 10% over `progress` (0..1: the
    share of the steps or of the time spent)."""
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    return warm * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class Divergence:
    """Watches the loss as the loop reads it: a loss over `ratio` times the lowest so far halves
    the learning rate (at most once every `cooldown` steps, which the lower rate needs to show
    its effect); a further rise after `max_drops` halvings, or a loss that is not a number, stops
    the training. What happened goes to report.json."""

    ratio: float = 2.0
    cooldown: int = 10
    max_drops: int = 3
    scale: float = 1.0  # of the learning rate
    lowest: float = math.inf
    calm_from: int = 0  # the first step at which another halving may come
    drops: list[dict] = field(default_factory=list)
    stopped: str | None = None

    def observe(self, step: int, loss: float) -> bool:
        """Takes the mean loss of the steps up to `step`; False: stop training."""
        if not math.isfinite(loss):
            self.stopped = f"the loss became {loss} at step {step}"
            return False
        if loss > self.ratio * self.lowest and step >= self.calm_from:
            if len(self.drops) == self.max_drops:
                self.stopped = (f"the loss rose to {loss:.4g} at step {step} (lowest {self.lowest:.4g}) after "
                                f"{self.max_drops} halvings of the learning rate")
                return False
            self.scale /= 2
            self.calm_from = step + self.cooldown
            self.drops.append({"step": step, "loss": round(loss, 4), "lowest": round(self.lowest, 4),
                               "scale": self.scale})
        self.lowest = min(self.lowest, loss)
        return True

    def as_dict(self, peak: float) -> dict:
        """report.json's "divergence": each halving (its step, the loss, the lowest before it, the
        peak learning rate from then on) and why the training stopped early, or null."""
        return {"lr_drops": [{"step": d["step"], "loss": d["loss"], "lowest": d["lowest"], "lr": d["scale"] * peak}
                             for d in self.drops], "stopped": self.stopped}


class Trainer:
    """One head, one target, one device: `run` trains until the step count or the deadline."""

    def __init__(self, target, head: Eagle3Head, plan: TrainPlan, windows: Windows, evalset: EvalSet,
                 capture: AuxCapture, device: torch.device):
        self.target, self.head, self.plan = target, head, plan
        self.windows, self.evalset, self.capture, self.device = windows, evalset, capture, device
        self.draft_ids = torch.arange(head.config.draft_vocab_size, device=device) + head.d2t
        decay = [p for p in head.parameters() if p.ndim >= 2]
        rest = [p for p in head.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": rest}],
                                           lr=plan.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
        self.generator = torch.Generator(device).manual_seed(plan.seed)  # --regenerate's sampling
        self.regenerated, self.pool = 0, torch.zeros(0, plan.seq_len, dtype=torch.long)

    def autocast(self):
        """bf16 autocast on CUDA, and on the CPU for a target that is not float32 (its hidden
        states then meet the head's float32 weights); the head's weights stay float32."""
        low = self.device.type == "cuda" or self.target.get_output_embeddings().weight.dtype != torch.float32
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=low)

    def batch(self) -> TargetBatch:
        ids = self.regenerated_batch() if self.plan.regenerate else self.windows.next()  # [B, T]
        # pinned and asynchronous: a plain copy to the GPU would wait for the steps queued before it
        ids = ids.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else ids
        return run_target(self.target, self.capture, ids, self.draft_ids)

    def regenerated_batch(self) -> torch.Tensor:
        """--regenerate: the target's continuations of the first quarter of data windows, made
        REGEN_POOL batches at a time (one decode step serves them all)."""
        if not len(self.pool):
            ids = torch.cat([self.windows.next() for _ in range(REGEN_POOL)]).to(self.device)
            keep = max(2, int(ids.shape[1] * REGEN_PROMPT_FRACTION))
            ids = continue_greedily(self.target, ids[:, :keep], ids.shape[1] - keep, REGEN_TEMPERATURE,
                                    self.generator)
            self.regenerated += ids.numel() - ids.shape[0] * keep
            self.pool = ids.cpu()
        ids, self.pool = self.pool[:self.plan.batch_size], self.pool[self.plan.batch_size:]
        return ids

    def step(self, factor: float) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = self.plan.lr * factor
        batch = self.batch()
        with self.autocast():
            loss = ttt_loss(self.head, batch, self.plan.ttt_steps)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        # A non-finite gradient comes out of clipping all NaN: zeroed, it moves no weight to NaN
        # (without a host sync; Divergence stops the loop once it reads the loss).
        for p in self.head.parameters():
            if p.grad is not None:
                p.grad.nan_to_num_(0.0, 0.0, 0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def evaluate(self) -> list[float]:
        self.head.eval()
        try:
            return head_acceptance(self.head, self.evalset, self.autocast())
        finally:
            self.head.train()

    def run(self, deadline: float, report: Callable[[Progress], None], eval_seconds: float = 20.0) -> Outcome:
        """Train until plan.steps (0: the deadline, a time.perf_counter() value); Ctrl-C ends the
        loop and keeps what the head has learnt. `report` is called after every step."""
        plan, start = self.plan, time.perf_counter()
        progress = Progress(steps=plan.steps)
        progress.acceptance = self.evaluate()
        evaluation = time.perf_counter() - start
        eval_seconds = max(eval_seconds, 5 * evaluation)  # evaluating takes at most a sixth of the time
        # room for the final evaluation (the same size) and saving before the hard deadline
        deadline -= 2 * evaluation + 2.0
        progress.budget = max(1e-3, deadline - start)
        watch, losses, complete = Divergence(), [], True
        last_eval, last_read, sums, count = time.perf_counter(), 0.0, None, 0
        report(progress)
        try:
            while (plan.steps == 0 or progress.step < plan.steps) and time.perf_counter() < deadline:
                fraction = progress.step / plan.steps if plan.steps else (time.perf_counter() - start) / progress.budget
                loss = self.step(lr_factor(progress.step, fraction, plan.warmup_steps) * watch.scale)
                sums, count, progress.step = (loss if sums is None else sums + loss), count + 1, progress.step + 1
                now = time.perf_counter()
                if now - last_read >= 0.5 or progress.step == plan.steps:  # the loop's one host read
                    progress.loss, last_read, sums, count = (sums / count).item(), now, None, 0
                    if not watch.observe(progress.step, progress.loss):
                        break
                    losses.append((progress.step, round(progress.loss, 4)))
                if now - last_eval >= eval_seconds:
                    progress.acceptance, last_eval = self.evaluate(), time.perf_counter()
                progress.elapsed = time.perf_counter() - start
                report(progress)
        except KeyboardInterrupt:
            complete = False
        return Outcome(progress.step, complete, losses, progress.acceptance, time.perf_counter() - start,
                       progress.step * plan.batch_size * plan.seq_len, self.regenerated, watch)


def curve_summary(losses: list[tuple[int, float]], points: int = 20) -> dict:
    """The loss curve in at most `points` entries, with its first, last and lowest values."""
    if not losses:
        return {"first": None, "last": None, "min": None, "curve": []}
    every = max(1, math.ceil(len(losses) / points))
    curve = losses[::every] + ([losses[-1]] if (len(losses) - 1) % every else [])
    return {"first": losses[0][1], "last": losses[-1][1], "min": min(v for _, v in losses),
            "curve": [[s, v] for s, v in curve]}


# ---------------------------------------------------------------- the command's work


def train_head(profile, plan: TrainPlan, data: Data, out: Path, started: float, report: Callable[[Progress], None],
               written_profile, command: str | None, allow_pickle: bool = False) -> dict:
    """Load the profile's target, train a head until `plan.minutes` after `started` (a
    time.perf_counter() value), write `out` (the head in the speculators format, profile.toml
    made from `written_profile`, report.json) and return the report. Ctrl-C while training still
    writes a usable head; the report then says `"complete": false`."""
    from specgen.core.drafters import head_formats
    from specgen.core.models import loading as models

    torch.set_num_threads(models.cpu_threads(profile.runtime))
    runtime = profile.runtime
    tokenizer = models.load_tokenizer(profile.target, allow_pickle, runtime.download, runtime.modeling)
    target = models.load_model(profile.target, allow_pickle, runtime.download, runtime.modeling)
    target.requires_grad_(False)
    config, device = target.config, target.get_output_embeddings().weight.device
    context = getattr(config, "max_position_embeddings", None)
    plan.check_against_target(config.num_hidden_layers, config.vocab_size, context)
    plan = plan.for_device(device.type == "cuda", context)
    layer_ids = plan.resolved_layers(config.num_hidden_layers)
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    draft_ids = draft_vocabulary(tokenizer, data.train, eos_id, plan.resolved_draft_vocab(config.vocab_size),
                                 config.vocab_size)
    head = build_head(target, layer_ids, draft_ids, plan.init_from_target, plan.seed, device)
    head_formats.check_against(head.config, config, "the new head")
    capture = AuxCapture(target, layer_ids)
    try:
        with torch.no_grad():
            prompts = eval_prompts(tokenizer, data.heldout, eos_id, plan.eval_prompts).to(device)
            evalset = EvalSet(run_target(target, capture, continue_greedily(target, prompts, EVAL_NEW_TOKENS),
                                         draft_ids.to(device)), EVAL_PROMPT_TOKENS)
        windows = Windows(tokenizer, data.train, eos_id, plan.seq_len, plan.batch_size, plan.seed)
        trainer = Trainer(target, head, plan, windows, evalset, capture, device)
        outcome = trainer.run(started + 60 * plan.minutes, report)
        try:  # a Ctrl-C from here on still saves the head, with the last measurement
            outcome.acceptance = trainer.evaluate()
            if outcome.complete:
                outcome.draft_acceptance = _draft_acceptance(profile, evalset, allow_pickle)
        except KeyboardInterrupt:
            outcome.complete = False
    finally:
        capture.remove()
    document = {"complete": outcome.complete, "command": command, "profile": profile.name,
                "target": profile.target.path, "device": device_name(device), "data": data.description,
                **_results(plan, head, outcome, evalset, windows),
                "wall_seconds": round(time.perf_counter() - started, 1), **versions()}
    with _interrupts_held():
        head_folder.write(out, lambda folder: _write(folder, head, config, profile, written_profile, document, out))
    return document


def _write(folder: Path, head: Eagle3Head, config, profile, written_profile, document: dict, out: Path) -> None:
    """The head, its profile (paths relative to `out`, where the files end up) and report.json."""
    from specgen.core.drafters import head_formats

    head_formats.save_speculators(head, folder, verifier_name=profile.target.path,
                                  verifier_architectures=list(getattr(config, "architectures", None) or []),
                                  speculative_tokens=SHOWN_K)
    (folder / "profile.toml").write_text(head_profile(written_profile, out), encoding="utf-8")
    (folder / "report.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _results(plan: TrainPlan, head: Eagle3Head, outcome: Outcome, evalset: EvalSet, windows: Windows) -> dict:
    """report.json's account of the training and of the head's simulated acceptance."""
    chains = len(evalset.starts) * evalset.batch.ids.shape[0]
    results = {
        "seed": plan.seed, "plan": vars_of(plan), "aux_layer_ids": list(head.config.aux_layer_ids),
        "draft_vocab_size": head.config.draft_vocab_size, "head_params": sum(p.numel() for p in head.parameters()),
        "steps": outcome.steps, "tokens_seen": outcome.tokens_seen, "regenerated_tokens": outcome.regenerated_tokens,
        "epochs": windows.epochs, "train_seconds": round(outcome.train_seconds, 1),
        "loss": curve_summary(outcome.losses), "divergence": outcome.divergence.as_dict(plan.lr),
        "simulated_acceptance": _by_k(outcome.acceptance),
        "eval": {"prompts": evalset.batch.ids.shape[0], "prompt_tokens": evalset.prompt_tokens,
                 "new_tokens": EVAL_NEW_TOKENS, "chains": chains,
                 "what": "the target's greedy continuations of held-out prompts; the mean accepted length "
                         "(accepted + 1) if the head drafted greedily from every position"},
    }
    if outcome.draft_acceptance is not None:
        results["draft_model_simulated_acceptance"] = _by_k(outcome.draft_acceptance)
    return results


@contextlib.contextmanager
def _interrupts_held():
    """While the output is written, a Ctrl-C waits (one file half-written would lose the head);
    it is raised once everything is on disk."""
    pending = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: nothing to hold
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


PROFILE_HEADER = """\
# Written by `specgen train-head` (report.json has the command); paths are relative to this file.
"""


def head_profile(source, out: Path) -> str:
    """The source profile's target, draft and settings, with the head in this folder as the
    proposer ([proposer] kind = "eagle", head = ".")."""
    import dataclasses

    from specgen.core.profile import (
        _toml_value,  # the profile format's one writer of values
    )

    lines = [PROFILE_HEADER.rstrip("\n"), f"name = {_toml_value(source.name + '-eagle')}",
             f"description = {_toml_value('An EAGLE-3 head trained by specgen train-head for ' + source.name)}"]
    for table in ("target", "draft", "proposer", "speculation", "sampling", "runtime", "kernels"):
        spec = getattr(source, table)
        if spec is None:
            continue
        values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                  if getattr(spec, f.name) != f.default and getattr(spec, f.name) is not None}
        if table in ("target", "draft"):
            values["path"] = _relative(spec.path, out)
        if table == "proposer":
            values = {"kind": "eagle", "head": ".", **{k: v for k, v in values.items() if k != "kind"}}
        if values:
            lines += ["", f"[{table}]", *(f"{key} = {_toml_value(value)}" for key, value in values.items())]
    return "\n".join(lines) + "\n"


def _relative(path: str, out: Path) -> str:
    """A local folder as a path relative to `out` ("./" or "../" first, as profiles want it); a
    hub id as it is."""
    if not Path(path).is_absolute():
        return path
    if os.path.commonpath([path, str(out.absolute())]) == os.sep:
        return path  # nothing in common but the root: the absolute path reads better
    relative = os.path.relpath(path, out.absolute())
    return relative if relative.startswith("..") else f"./{relative}"


def _by_k(lengths: list[float]) -> dict[str, float]:
    return {str(k): round(v, 4) for k, v in enumerate(lengths, start=1)}


def _draft_acceptance(profile, evalset: EvalSet, allow_pickle: bool) -> list[float] | None:
    """The profile's draft model on the same simulation, for comparison (None without one)."""
    from specgen.core.models import loading as models

    if profile.draft is None:
        return None
    runtime = profile.runtime
    draft = models.load_model(profile.draft, allow_pickle, runtime.download, runtime.modeling)
    return model_acceptance(draft, evalset)


def vars_of(plan: TrainPlan) -> dict:
    import dataclasses

    return {name: (list(value) if isinstance(value, tuple) else value)
            for name, value in dataclasses.asdict(plan).items()}


def device_name(device: torch.device) -> str:
    import platform

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def versions() -> dict:
    import platform

    import transformers

    from specgen import __version__

    return {"specgen": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}
