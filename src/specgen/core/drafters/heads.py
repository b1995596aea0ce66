"""Drafters that read the target's own hidden states: EAGLE-3 heads and MTP layers.

The target's verification step already computes every hidden state a head needs. `AuxTap` copies
the chosen ones into a static buffer while the target runs (forward hooks, active only inside the
runner's own forwards), so a round hands them to the head without a second target pass, and a
captured round captures the copies too.

Rows pair up as in core/drafters/eagle.py: the head's row t sits at position t, embeds id x[t+1], reads the
target's states at t and predicts x[t+2]. A round (core/round/head.py) drives a head in two calls:

    extend   over the k + 1 rows of the previous round's target step (ids: that round's output
             row, accepted drafts then the new token; features: the tap), at positions P - e ..
             P - e + k, where P is the target's position and e the tokens the previous round
             emitted. Rows past e - 1 are stale: their keys sit at positions the next calls
             overwrite before any query can see them. Row e - 1 predicts the first draft.
    step     one drafted id on the head's own output hidden state, at the next position.

Nothing rolls back: every call writes at positions derived from the target's, so the head's cache
always holds target-feature rows for the committed sequence.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch

from specgen.core.errors import UsageError

SLACK = 64  # as gpu/runner.py: positions past the longest request (warm-ups, padded steps)
TAP_ROWS = 64  # rows the tap holds: a round's k + 1 (k <= 32) and a prefill chunk


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def decoder_layers(model) -> torch.nn.ModuleList:
    """The target's decoder layers (transformers' and core/step/'s models keep them at model.layers)."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise UsageError(f"the target ({type(model).__name__}) has no decoder layers at model.layers: "
                         "a head cannot read its hidden states", hint="use --proposer draft or ngram")
    return layers


class AuxTap:
    """Hidden states of the target at `points`, copied into `out` [rows, len(points) * H] during the
    runner's forwards: point i < N is the residual stream entering decoder layer i (0: the
    embeddings), point N the final norm's output (transformers' output_hidden_states numbering).

    Hooks copy only while `active` (the runner's forwards and captures), so other users of the same
    model object (Hugging Face baselines) are left alone. A step over B sequences' n rows each
    fills rows b * n .. b * n + n - 1 with sequence b's (a batch round's own tap,
    core/round/batch_head.py). A forward of more than `rows` tokens is
    not copied: that is a prefill no head reads (a draft-model round's, in a bench that runs both),
    since a head's round feeds its prefill in chunks of `rows` (core/drafters/heads.prefill_head)."""

    def __init__(self, model, points: tuple[int, ...], rows: int):
        layers = decoder_layers(model)
        self.points, self.rows = tuple(points), rows
        self.hidden = model.get_input_embeddings().weight.shape[1]
        weight = model.get_output_embeddings().weight
        self.out = torch.zeros(rows, len(points) * self.hidden, dtype=weight.dtype, device=weight.device)
        self.active = False
        self.handles = []
        for j, point in enumerate(self.points):
            if 0 <= point < len(layers):
                hook = layers[point].register_forward_pre_hook(self._pre_hook(j), with_kwargs=True)
            elif point == len(layers) and isinstance(getattr(model.model, "norm", None), torch.nn.Module):
                hook = model.model.norm.register_forward_hook(self._post_hook(j))
            else:
                raise UsageError(f"hidden state {point} is not one of the target's (0 to {len(layers)})",
                                 hint="give layer ids below the target's number of layers")
            self.handles.append(hook)

    @contextlib.contextmanager
    def armed(self):
        saved, self.active = self.active, True
        try:
            yield
        finally:
            self.active = saved

    def _write(self, j: int, hidden: torch.Tensor) -> None:
        if not self.active:
            return
        n = hidden.numel() // self.hidden  # a batch's B x n rows, sequence after sequence
        if n > self.rows:
            return
        self.out[:n, j * self.hidden:(j + 1) * self.hidden].copy_(hidden.reshape(n, self.hidden))

    def _pre_hook(self, j: int):
        def hook(module, args, kwargs):
            self._write(j, args[0] if args else kwargs["hidden_states"])
        return hook

    def _post_hook(self, j: int):
        def hook(module, args, output):
            self._write(j, output[0] if isinstance(output, tuple) else output)
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class HeadDrafter(Protocol):
    """What core/round/head.py needs of a drafter on the target's hidden states."""

    tap: AuxTap
    position: torch.Tensor  # [] int64 (the round does not move it: positions come from the target's)
    capacity: int
    generation: int  # bumped when the cache is re-allocated (captured rounds must re-capture)
    use_graphs: bool  # whether its calls can be captured in a CUDA graph

    def reset(self) -> None: ...

    def reserve(self, positions: int) -> None: ...

    def features(self, rows: int) -> torch.Tensor: ...

    def prefill(self, ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor) -> None: ...

    def extend(self, ids: torch.Tensor, features: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def step(self, ids: torch.Tensor, hidden: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def accelerate(self, backend) -> str:
        """Take what `backend` offers for its calls (Backend.head_ops); returns the path the
        calls now take: "kernels" or "torch" (for the run's report)."""
        ...


class EagleDrafter:
    """An Eagle3Head (core/drafters/eagle.py) as the round's drafter: logits over the target's vocabulary
    (width columns, -inf outside the draft vocabulary), its static cache sized like the target's."""

    use_graphs = True

    def __init__(self, head, tap: AuxTap, width: int, capacity: int, span: slice | None = None,
                 eager: bool = False):
        self.head, self.tap, self.width = head, tap, width
        self.capture = None  # Backend.graph, with the kernels: prefill in captured chunks
        self.chunk = None  # (generation, replay) of the captured prefill chunk
        # eager (the torch backend): attend over the live slots only, read on the host; captured
        # steps attend over the whole cache (fixed shapes) with the stale slots masked
        self.eager = eager
        self.span = span or slice(None)  # its columns of the tap
        self.position = head.position
        self.generation = 0
        self.capacity = 0
        device = head.d2t.device
        # target id of each draft-vocabulary column, computed once (index_copy_ in every call)
        self.columns = torch.arange(head.config.draft_vocab_size, device=device) + head.d2t
        # the whole vocabulary in the target's order: logits need no scatter into -inf columns
        self.identity = head.config.draft_vocab_size == width and bool((head.d2t == 0).all())
        self._allocate(capacity)

    def accelerate(self, backend) -> str:
        ops = backend.head_ops(self.head)
        if ops is None:
            return "torch"
        self.head.ops, self.capture = ops, backend.graph
        # the captured prefill chunk's inputs: as many rows as the tap holds (prefill_head feeds
        # the target chunks of that size), at chunk_at + 0, 1, ...
        device, features, rows = self.head.d2t.device, self.features(1), self.tap.rows
        self.chunk_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.chunk_features = features.new_zeros(rows, features.shape[1])
        self.chunk_at = torch.zeros((), dtype=torch.long, device=device)
        self.chunk_steps = torch.arange(rows, device=device)
        return "kernels"

    def _allocate(self, capacity: int) -> None:
        self.head.reserve(capacity)
        self.capacity = capacity
        self.generation += 1

    def reset(self) -> None:
        self.head.reset()

    def reserve(self, positions: int) -> None:
        """The same rule as gpu/runner.py's GraphRunner, so the two caches keep the same capacity."""
        if positions + SLACK > self.capacity:
            self._allocate(_round_up(positions + SLACK, 512))

    def features(self, rows: int) -> torch.Tensor:
        return self.tap.out[:rows, self.span]

    def _logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return draft_logits.float()
        out = draft_logits.new_full((draft_logits.shape[0], self.width), float("-inf"), dtype=torch.float32)
        return out.index_copy_(1, self.columns, draft_logits.float())

    def _keys(self, positions: torch.Tensor) -> int | None:
        return int(positions.max()) + 1 if self.eager else None

    def prefill(self, ids, features, positions):
        """Rows at consecutive positions. With the backend's kernels, in captured chunks of the
        tap's rows (a chunk's launches cost more than its work; the padding rows write keys past
        the prompt, which later calls overwrite before any query reads them); else one forward of
        the head's own modules."""
        if self.capture is None:
            self.head(ids, features, positions, self._keys(positions))
            return
        replay, rows = self._chunk_replay(), self.chunk_ids.shape[0]
        for at in range(0, ids.shape[0], rows):
            n = min(rows, ids.shape[0] - at)
            self.chunk_ids[:n].copy_(ids[at:at + n])
            self.chunk_features[:n].copy_(features[at:at + n])
            self.chunk_at.copy_(positions[at])
            replay()

    def _chunk_call(self) -> None:
        self.head.forward(self.chunk_ids, self.chunk_features, self.chunk_at + self.chunk_steps, None, False)

    def _chunk_replay(self):
        """The prefill chunk's replay, (re)captured after the cache was re-allocated. Warm-up and
        capture run at the scratch end of the cache, never a live position (reserve keeps SLACK)."""
        if self.chunk is None or self.chunk[0] != self.generation:
            self.chunk_at.fill_(self.capacity - self.chunk_ids.shape[0])
            self.chunk = (self.generation, self.capture(self._chunk_call, "the head's prefill"))
        return self.chunk[1]

    def extend(self, ids, features, positions):
        logits, hidden = self.head.forward(ids, features, positions, self._keys(positions), False)
        return self._logits(logits), hidden

    def step(self, ids, hidden, positions):
        logits, hidden = self.head.forward(ids, hidden, positions, self._keys(positions), False)
        return self._logits(logits), hidden

    def step_rows(self, rows, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """step over given rows (a token tree's level: core/round/head_tree.py), each on the
        hidden state [N, H] of its parent: (logits [N, width], output hidden states [N, H])."""
        keys = int(rows.slots.max()) + 1 if self.eager else None  # tails name earlier slots only
        logits, hidden = self.head.forward_rows(rows, hidden, keys)
        return self._logits(logits), hidden

    def hidden_rows(self, n: int) -> torch.Tensor:
        """A buffer for n of the head's output hidden states (zeros)."""
        weight = self.head.fc.weight
        return weight.new_zeros(n, self.head.config.hidden_size)


class MtpDrafter:
    """A checkpoint's MTP layer (core/drafters/mtp.py) as the round's drafter. Its cache is a growing one,
    rolled back to each call's first position on the host: these rounds run eagerly (no capture)."""

    use_graphs = False

    def __init__(self, layer, tap: AuxTap, width: int, capacity: int, span: slice | None = None):
        self.layer, self.tap, self.width = layer, tap, width
        self.span = span or slice(None)  # its columns of the tap
        self.cache = layer.new_cache()
        device = tap.out.device
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.capacity, self.generation = capacity, 0

    def reset(self) -> None:
        self.cache.reset()

    def reserve(self, positions: int) -> None:
        self.capacity = max(self.capacity, positions + SLACK)

    def accelerate(self, backend) -> str:
        return "torch"  # a growing cache: no capture, no kernels

    def features(self, rows: int) -> torch.Tensor:
        return self.tap.out[:rows, self.span]

    def _run(self, ids, hidden, positions):
        self.cache.rollback(min(int(positions[0]), self.cache.length))
        logits, out = self.layer(ids[None], hidden[None], self.cache)
        return self._logits(logits[0]), out[0]

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        cols = min(logits.shape[-1], self.width)
        full = logits.new_full((logits.shape[0], self.width), float("-inf"), dtype=torch.float32)
        full[:, :cols] = logits[:, :cols].float()
        return full

    def prefill(self, ids, features, positions):
        self._run(ids, features, positions)

    def extend(self, ids, features, positions):
        return self._run(ids, features, positions)

    def step(self, ids, hidden, positions):
        return self._run(ids, hidden, positions)

    def step_rows(self, rows, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """step over a token tree's level (core/round/head_tree.py), each row on its parent's
        hidden state [N, H]: (logits [N, width], output hidden states [N, H]).

        A tree's slots are this growing cache's entries: the level's rows (core/round/tree.py
        level_rows) take slots start + (l - 1) w + f, their ancestors' levels the slots just
        before, and start is the target's position, the committed prefix's length here too (entry
        t is the pair at position t). So rolling back to the level's first slot (level 1: start,
        dropping the extend's stale rows past it; later levels: the cache's length, the levels
        before stay) and appending the rows in slot order puts each at the entry its slot names,
        and the rows' `seen` over entries is their mask: the prefix, their ancestors, themselves,
        no sibling or other branch. Rotary positions are the rows' own (start + l - 1), not the
        entries'. The next call at a committed position (the next round's extend) drops every
        level's entries. Reads the slots on the host: these rounds run eagerly."""
        from specgen.core.step.rows import seen

        first = int(rows.slots[0, 0])
        self.cache.rollback(min(first, self.cache.length))
        n = rows.count
        if self.cache.length != first or not torch.equal(rows.slots[0], first + torch.arange(n, device=rows.slots.device)):
            raise ValueError(f"MTP tree rows must take the slots after the cache's {self.cache.length} entries, "
                             "in order")
        keys = seen(rows.start, n, first + n, rows.tail, rows.depth)  # [1, n, first + n]
        logits, out = self.layer(rows.ids, hidden[None], self.cache, rows.positions, keys)
        return self._logits(logits[0]), out[0]

    def hidden_rows(self, n: int) -> torch.Tensor:
        """A buffer for n of the layer's output hidden states (zeros)."""
        weight = self.layer.proj.weight
        return weight.new_zeros(n, weight.shape[0])



def prefill_head(head: HeadDrafter, target, ids: list[int], device: torch.device, put=None) -> None:
    """The target's prefill over ids[:-1] in chunks the tap holds, their states gathered; then one
    head forward over rows t = 0 .. len - 3 (id ids[t+1], the target's states at t). The prompt's
    last target row is left in the tap's row 0 for the first round to extend over. A one-token
    prompt has no target row: the first round's drafts read zeros (verified like any other).
    put(host tensor) -> device tensor: how the ids reach the device (a batch's Staging, whose copies
    do not wait for the round in flight; default: a plain copy)."""
    put = put or (lambda values: values.to(device))
    tap = head.tap
    head.reset()
    tap.out.zero_()
    prefix = torch.tensor(ids[:-1], dtype=torch.long)
    states, n = [], 0
    for at in range(0, prefix.shape[0], tap.rows):
        chunk = prefix[at:at + tap.rows]
        n = chunk.shape[0]
        target.forward(put(chunk), want_logits=False)
        states.append(head.features(n).clone())  # the next chunk's replay overwrites the tap
    if n:
        tap.out[:1].copy_(tap.out[n - 1:n])
    rows = prefix.shape[0] - 1
    if rows > 0:
        follow = put(torch.tensor(ids[1:rows + 1], dtype=torch.long))
        head.prefill(follow, torch.cat(states)[:rows], torch.arange(rows, device=device))



def input_embedding(model) -> torch.Tensor:
    return model.get_input_embeddings().weight


def build_heads(drafters: set[str], proposer, target, target_folder, capacity: int, width: int,
                eager: bool = False) -> tuple[AuxTap | None, dict[str, HeadDrafter]]:
    """The tap on the target and a drafter for each of "eagle" / "mtp" in `drafters`. The tap must
    exist before the target's runner captures its steps (it arms the tap in each). eager: the
    rounds run eagerly (the torch backend), so a head may read positions on the host.
    target_folder(): the target checkpoint's local folder (MTP layers are read from its files)."""
    wanted = [kind for kind in ("eagle", "mtp") if kind in drafters]
    if not wanted:
        return None, {}
    device, dtype = input_embedding(target).device, input_embedding(target).dtype
    config = target.config
    layers = len(decoder_layers(target))
    points: list[int] = []
    built: dict[str, tuple[object, list[int]]] = {}
    if "eagle" in wanted:
        from specgen.core.drafters.head_formats import check_against, load_head

        head = load_head(proposer.head, embedding=input_embedding(target), capacity=1, device=device, dtype=dtype)
        head_config = check_against(head.config, config, where=f"the head {proposer.head}")
        built["eagle"] = (head, list(head_config.aux_layer_ids))
    if "mtp" in wanted:
        from specgen.core.drafters.mtp import declared, load_mtp_layers, mtp_layers

        folder = target_folder()
        mtp_layers(declared(folder))  # the checkpoint's own model type and count, named in any refusal
        mtp = load_mtp_layers(folder, config, dtype)
        built["mtp"] = (mtp[0].to(device), [layers])  # the first layer drafts every step (vLLM's rule for one)
    spans = {}
    for kind, (_, ids) in built.items():
        spans[kind] = slice(len(points) * config.hidden_size, (len(points) + len(ids)) * config.hidden_size)
        points.extend(ids)
    tap = AuxTap(target, tuple(points), TAP_ROWS)
    out: dict[str, HeadDrafter] = {}
    if "eagle" in built:
        out["eagle"] = EagleDrafter(built["eagle"][0], tap, width, capacity, spans["eagle"], eager)
    if "mtp" in built:
        out["mtp"] = MtpDrafter(built["mtp"][0], tap, width, capacity, spans["mtp"])
    return tap, out
