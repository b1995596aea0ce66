"""An EAGLE-3 head drafting every row of a batch (core/round/batch_round.py's drafter part).

The chain round's head (core/round/head.py) with a batch dimension: each row b extends the head
over its own previous round's k + 1 target rows (its output row: accepted drafts, then the new
token, stale ids past them; the target's states at those rows, from this part's tap), at its own
positions P_b - e_b .. P_b - e_b + k (e_b: the tokens it emitted, ragged across rows), in its own
row of this part's head cache; its row e_b - 1 predicts its first draft; then k - 1 head steps
over the B rows at once, each on its own output hidden state at P_b + i - 1. Every row computes
what it computes alone (the same ops over more rows, each row reading its own cache row only).

Buffers are allocated once (the cache and its rotary table when the round's caches grow); the body
reads no host value, so the round captures it whole. A row's prompt is prefilled as the chain round
prefills it (core/drafters/heads.prefill_head: the target in chunks the engine's tap holds, then the
head), by the engine's head and target runner, and both caches' slots copied into the row, at once:
not with the other rows' prompts at the next flush (core/round/batch_prefill.py), since the head
reads the target's tapped hidden states of every chunk.
"""

from __future__ import annotations

import torch

from specgen.core.drafters.eagle import Slots
from specgen.core.drafters.heads import AuxTap, prefill_head
from specgen.core.step.rows import Rows


class BatchHead:
    """drafter: the engine's EagleDrafter (core/drafters/heads.py): its head's weights, its tap's
    points, its single-sequence cache for prefills and its vocabulary map."""

    runners: list = []  # no model the round keeps a cache of: the head's cache is this part's
    one_hot = False  # its drafts race q on the device
    host_proposes = False

    def __init__(self, rnd, drafter):
        k, batch, z = rnd.k, rnd.batch, dict(device=rnd.device)
        self.rnd, self.drafter, self.head = rnd, drafter, drafter.head
        hidden = drafter.tap.hidden
        first, stop, _ = drafter.span.indices(len(drafter.tap.points) * hidden)
        # the target's states at the head's points, for the B x (k + 1) rows of the round's target
        # step (a tree round's B x (n + 1): core/round/batch_head_tree.py)
        self.rows = rnd.target_rows_per
        self.tap = AuxTap(rnd.target.model, drafter.tap.points[first // hidden: stop // hidden], batch * self.rows)
        self.ops = rnd.backend.head_ops(self.head, batch=True) or self.head.ops
        self.steps = torch.arange(k + 1, **z)
        self.origin = torch.zeros(batch, dtype=torch.long, **z)  # each row's P - e: its extend's first position
        self.extend_positions = torch.zeros(batch, k + 1, dtype=torch.long, **z)
        self.last = torch.zeros(batch, 1, dtype=torch.long, **z)  # each row's e - 1
        self.step_positions = torch.zeros(batch, 1, dtype=torch.long, **z)
        self.cache: Slots | None = None
        self.rotary: torch.Tensor | None = None  # [C, 2, D]: cos and sin of every position (Rotary.tabulate's)

    def room(self, slots: int, capacity: int) -> None:
        """The head cache of B rows and `capacity` slots (the rows keeping their keys and values),
        and the rotary table of as many positions."""
        head, batch = self.head, self.rnd.batch
        weight = head.fc.weight
        shape = (batch, head.config.num_key_value_heads, capacity, head.config.head_dim)
        keys, values = weight.new_zeros(shape), weight.new_zeros(shape)
        if self.cache is not None:
            keys[:, :, :self.cache.capacity].copy_(self.cache.keys[0])
            values[:, :, :self.cache.capacity].copy_(self.cache.values[0])
        self.cache = Slots(keys, values)
        with torch.inference_mode():
            cos, sin = head.rotary(torch.arange(capacity, device=weight.device), weight.dtype)
        self.rotary = torch.cat([cos, sin], dim=1)

    def start(self, b: int, ids: list[int]) -> None:
        """Row b's prompt through the engine's target runner and head as the chain round feeds them,
        both caches' slots copied into row b, and its first round set to extend over the prompt's
        last target row as if the round before had emitted `last` (core/round/head.HeadDrafts)."""
        rnd, head = self.rnd, self.head
        rnd.positions[0, b].fill_(len(ids) - 1)
        rnd.target.reset()
        self.drafter.reserve(len(ids))
        with torch.inference_mode():
            prefill_head(self.drafter, rnd.target, ids, rnd.device, rnd.staging.put)
            rnd.adopt(0, b, len(ids) - 1)
            n = max(len(ids) - 2, 0)  # the head's prompt rows
            self.cache.keys[0][b, :, :n].copy_(head.k_cache[0, :, :n])
            self.cache.values[0][b, :, :n].copy_(head.v_cache[0, :, :n])
            self._first_features(b)
        rnd.out[b].fill_(-1)
        rnd.out[b, 0].fill_(ids[-1])
        rnd.emitted[b].fill_(1)

    def _first_features(self, b: int) -> None:
        """The prompt's last target row (the engine's tap's row 0 after the prefill), where row b's
        first extend reads it: its first row of this part's tap."""
        self.tap.out[b * self.rows].copy_(self.drafter.features(1)[0])

    def draft(self) -> None:
        """Every row's k drafts into feed[:, 1:] (core/round/head.py's HeadDrafts.draft, row by row)."""
        rnd, k, batch = self.rnd, self.rnd.k, self.rnd.batch
        logits, hidden = self._extend(self.tap.out[:batch * (k + 1)].view(batch, k + 1, -1))
        self._pick(0, logits)
        for i in range(1, k):  # step i embeds draft i - 1 at position P + i - 1
            torch.add(rnd.positions[0][:, None], i - 1, out=self.step_positions)
            rows = Rows(rnd.feed[:, i: i + 1], self.step_positions, self.step_positions, self.step_positions[:, 0])
            logits, hidden = self._forward(hidden, rows)
            self._pick(i, logits[:, 0])
        rnd.draft_pick.count()

    def follow_host(self, rows: torch.Tensor) -> None:
        """Where the host's drafts replaced the head's (the hybrid proposer's rows whose lookup
        matched): nothing. The chain round's host round only extends (HeadDrafts.follow), which
        draft() did for every row; the head's k - 1 steps past it wrote positions P .. P + k - 2,
        which the next round's extend (over P .. P + k, the target's rows from this round's start)
        writes anew before any call reads them."""

    def _extend(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over every row's previous round's k + 1 target rows (features [B, k + 1, F] in
        the output row's order): the logits [B, Vd] and hidden state [B, 1, H] of each row's last
        emitted row, which predict the token after its `last`."""
        rnd, k = self.rnd, self.rnd.k
        # the previous round's target rows, at P - e + j (P - e clamped at 0 as the chain round's:
        # a one-token prompt's first round)
        torch.sub(rnd.positions[0], rnd.emitted, out=self.origin)
        self.origin.clamp_(min=0)
        torch.add(self.origin[:, None], self.steps, out=self.extend_positions)
        ids = rnd.out.clamp_min(0)  # accepted drafts, then the new token; stale ids past them
        rows = Rows(ids, self.extend_positions, self.extend_positions, self.origin)
        logits, hidden = self._forward(features, rows)
        torch.sub(rnd.emitted[:, None], 1, out=self.last)
        self.last.clamp_(0, k)  # a row that never started: emitted 0
        hidden = hidden.gather(1, self.last[:, :, None].expand(-1, -1, hidden.shape[-1]))  # [B, 1, H]
        return logits.gather(1, self.last[:, :, None].expand(-1, -1, logits.shape[-1]))[:, 0], hidden

    def _forward(self, features: torch.Tensor, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the rows (features [B, n, 3 x target width] or its own states [B, n, H])."""
        head = self.head
        h = head.fused(features)
        rope = self.rotary[rows.positions]  # [B, n, 2, D]
        rotary = (rope[:, :, 0], rope[:, :, 1])
        if rotary[0].dtype != h.dtype:  # features in another dtype than the head's weights (as forward)
            cos, sin = head.rotary(rows.positions.reshape(-1), h.dtype)
            rotary = (cos.view(*rows.positions.shape, -1), sin.view(*rows.positions.shape, -1))
        return head.over_rows(h, rows, self.cache, self.ops, rotary)

    def _pick(self, i: int, logits: torch.Tensor) -> None:
        """Draft step i from the head's logits [B, Vd] into the round's draft logits, then every
        row's pick."""
        self._widen(self.rnd.draft_logits, logits)
        self.rnd.draft_pick(i)

    def _widen(self, out: torch.Tensor, logits: torch.Tensor) -> None:
        """The head's logits [..., Vd] over the target's vocabulary into out [..., width] (its
        columns outside the draft vocabulary stay -inf, as EagleDrafter's logits have them)."""
        if self.drafter.identity:
            out.copy_(logits)
        else:
            out.index_copy_(out.dim() - 1, self.drafter.columns, logits.float())

    def reading(self):
        """The round's target step, whose states the next round extends over: the tap copies them."""
        return self.tap.armed()

    def commit_fields(self) -> dict:
        return {}

    def state(self) -> list[torch.Tensor]:
        """The output row and the tap outlive the round only for the next round's extend."""
        return [self.rnd.out, self.tap.out]

    def close(self) -> None:
        self.tap.remove()
