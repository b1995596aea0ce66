"""The round over a batch with token trees: B rows, each its own tree drafted by the draft model
(BatchTreeDraftModel, below), an EAGLE-3 head (core/round/batch_head_tree.py's BatchHeadTree) or
prompt lookup (core/round/batch_lookup_tree.py's BatchLookupTree: the host's tries, staged before
the round; q one-hot) (speculation.tree_width > 1 at batch_size > 1).

The tree round's phases (core/round/tree_round.py), with a batch dimension, each row's tree its
own (BatchTrees: core/round/tree.py's TreeStack of B trees, each row's Tree a view of its row):

    draft    the drafter part's draft(): the models' grow_trees, below, or the host's staged
             trees copied into each row's Tree (prompt lookup); the models: the draft model over
             each row's `pending` [B, 2] (the root's children: level 1), then
             once per level over every row's w frontier nodes ([B, w] tree rows, each row in its own
             draft cache row past its own position); a head likewise after each row's extend over
             its accepted path (its levels past the target's position, on their parents' hidden
             states); each row's children from its own log q ([B w, V] in one tree_children call),
             every row's level built by one call of the ops' tree_expand
    select   each row's n best candidates, every row's by one call of the ops' tree_select
    target   one step over every row's root and n nodes ([B, n + 1] tree rows)
    verify   the rows' warp in one call, then one walk over [B, ...] (the walks take a leading
             batch dimension): greedy and Gumbel coupling the greedy walk; rejection coupling the
             recursive walk for the rows whose children are drawn and the greedy walk for greedy
             rows, each row taking its own
    commit   each row's accepted path compacted in the target's cache and the draft model's (the
             step's `compact` op over [B, k] slots), its positions, `pending` and next `last` (a
             head: its output row, and its path's target rows gathered from the tap); staged as a
             chain's rows: out | the drafts the walk followed | drafts that count

How a row stays what it is alone: every op is the one-request op over more rows, whose rows
depend on their own inputs only. The tree's construction too: tree_expand (once a level) and
tree_select take the whole stack, one launch each on a GPU with a program per row (per-row
launches were some 200 more kernels a round at B = 16 and k = 6), and a tree alone runs the
same op over a stack of one. Children are drawn per row: a row whose request is sampled draws
them (rejection coupling: from its own Exp(1) rows, drawn by its own generator in the single tree
round's order and shapes; Gumbel coupling: with the noise row of their depth, from its own key),
a greedy row takes its top-w (its noise rows are ones: log 1 = 0 leaves each key its log q, bit
for bit).

Prompt lookup's trees (one-hot q) take the walks of the single round's host trees: greedy and
Gumbel coupling follow the target's token, rejection coupling's sampled rows the sibling walk, each
row drawing its noise row and uniforms alone (no children's rows).

Penalties and min_tokens (core/round/batch_rows.py's tree_rows): as the single round's TreeRows,
each tree row counts its row's output and the drafts on its path, and masks the stop ids while its
depth is short of min_tokens; the drafts' children are scored without them, as alone.

The hybrid proposer's trees: core/round/batch_hybrid_tree.py (each row the lookup's trie or the
model's tree, its own turn).

Each row's staged ids take the tree round's layout (out | drafts | n | taken | ranks): a drawn
child accepted outside the tree (`taken`) is a draft accepted, and the ranks give each row the
tree statistics it gets alone (what its trees bought over their chains, core/stats.py).

Not here: merged hybrid trees (engine.batch_refusal refuses them; MTP layers draft no batch at
all) and the tree's insight stage (p, q and entropy per node: inspect-acceptance runs one
request).
"""

from __future__ import annotations

import torch

from specgen.core.round.batch_round import FIELDS, BatchDraftModel, BatchRound, RowParams
from specgen.core.round.drafters import draft_spec
from specgen.core.round.tree import Tree, TreeStack
from specgen.core.sampling import noise
from specgen.core.sampling.bookkeeping import path_ranks
from specgen.core.sampling.warp import PenaltyRows, WarpParams, exponentials_, uniforms_
from specgen.core.settings import SamplingSpec
from specgen.core.step import rows as rowsets
from specgen.core.step.rows import Rows


class BatchTrees(TreeStack):
    """B trees of one envelope (k, w, n), stacked [B, ...] (core/round/tree.py's TreeStack): the
    ops build every row in one call, the batch's steps and walks read the stack; `trees`, each
    row's Tree (its `sampled`, and its buffers as one tree's, for the host and the tests)."""

    def __init__(self, batch: int, k: int, width: int, nodes: int, device: torch.device):
        super().__init__(batch, k, width, nodes, device)
        self.trees = [Tree(k, width, nodes, device, stack=self.row(b)) for b in range(batch)]

    def __getitem__(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    def level_rows(self, level: int, start: torch.Tensor) -> Rows:
        """Every row's draft rows [B, w] for frontier `level` (1 .. k - 1) past its start [B]."""
        i = level - 1
        return Rows(self.level_ids[:, i, 0].contiguous(), self.level_positions[:, i, 0].contiguous(),
                    self.level_slots[:, i, 0].contiguous(), start, self.level_tail[:, i, 0].contiguous(),
                    self.level_depth[:, i, 0].contiguous())

    def target_rows(self, start: torch.Tensor) -> Rows:
        """Every row's target rows [B, n + 1]: its root and selected nodes past its start [B]."""
        b = self.batch
        return Rows(self.ids.view(b, -1), self.positions.view(b, -1), self.slots.view(b, -1), start,
                    self.path.view(b, *self.path.shape[2:]), self.depth.view(b, -1))


class BatchTreeGumbel:
    """Gumbel coupling over trees: each row's noise rows (BatchCoupling's, keyed by its seed and
    positions); a node's target token races the row of its depth, the walk follows it; a sampled
    row's children at depth d + 1 are drawn with noise row d (TreeGumbel's)."""

    def __init__(self, rnd: "BatchTreeRound"):
        b, n, z = rnd.batch, rnd.nodes, dict(device=rnd.device)
        self.rnd = rnd
        self.noise = torch.ones(b, rnd.k + 1, rnd.width, dtype=torch.float32, **z)
        self.key = torch.zeros(b, 2, dtype=torch.long, **z)
        self.origin = torch.zeros(b, dtype=torch.long, **z)
        self.first = torch.zeros(b, dtype=torch.long, **z)
        self.choice = torch.zeros(b * (n + 1), dtype=torch.long, **z)
        self.seq = torch.arange(b, **z)[:, None]

    def state(self) -> list[torch.Tensor]:
        return []  # the body computes its noise

    def start(self, b: int, seed: int, origin: int) -> None:
        for i, half in enumerate(noise.split_seed(seed)):
            self.key[b, i].fill_(half)
        self.origin[b].fill_(origin)

    def draw(self, b: int, generator: torch.Generator, sampled: bool) -> None:
        """The noise is the body's: the host draws nothing."""

    def begin(self) -> None:
        torch.add(self.origin, self.rnd.generated, out=self.first)
        self.rnd.ops.gumbel_noise_rows(self.noise, self.key, self.first)

    def children_noise(self, level: int, rows: int) -> torch.Tensor | None:
        """[B rows, V]: each row's noise row `level` for each of its `rows` expanded nodes (greedy rows:
        ones); None where no row draws (draft_sampling = "argmax"): every row's top-w."""
        rnd = self.rnd
        if not rnd.draft_pick.races:
            return None
        row = torch.where(rnd.drawn_rows[:, None], self.noise[:, level], 1.0)  # [B, V]
        return row[:, None].expand(-1, rows, -1).reshape(-1, rnd.width)

    def keep_q(self, level: int, logq: torch.Tensor) -> None:
        """The walk follows the target's race: it never reads q."""

    def verify(self, rows: Rows, penalties, bad) -> tuple:
        rnd, trees = self.rnd, self.rnd.trees
        b, width = rnd.batch, rnd.width
        at_depth = self.noise[self.seq, rows.depth - 1]  # [B, n + 1, V]: each node's depth's row
        rnd.ops.warp_and_race(rnd.tree_logits.view(-1, width), rnd.target_params.params, at_depth.view(-1, width),
                              self.choice, penalties, bad)
        return rnd.ops.greedy_walk(trees["children"], rows.ids, self.choice.view(b, -1), rnd.num_drafts, rnd.k)


class BatchTreeRejection:
    """Rejection coupling over trees, per row as TreeRejection with drawn children: noise [B, V]
    (the recovered or bonus token's Exp(1) row), uniforms [B, k, w], and the children's Exp(1) rows
    [B, 1 + (k - 1) w, V] (one per node the draft expands), each row's drawn by its own generator in
    the tree round's order and shapes; q [B, 1 + (k - 1) w, V] the draft's probs at those nodes."""

    def __init__(self, rnd: "BatchTreeRound"):
        b, w, width, z = rnd.batch, rnd.tree_width, rnd.width, dict(dtype=torch.float32, device=rnd.device)
        self.rnd, self.w = rnd, w
        expanded = 1 + (rnd.k - 1) * w
        self.noise = torch.ones(b, width, **z)
        self.uniform = torch.ones(b, rnd.k, w, **z)
        self.kids_noise = torch.ones(b, expanded, width, **z)
        self.q = torch.zeros(b, expanded, width, **z)
        self.seq = torch.arange(b, device=rnd.device)[:, None]

    def state(self) -> list[torch.Tensor]:
        """The host's draws for the next round (a capture's warm-ups must not lose them)."""
        return [self.noise, self.uniform, self.kids_noise]

    def start(self, b: int, seed: int, origin: int) -> None:
        """The row's generator draws its numbers: nothing to key."""

    def draw(self, b: int, generator: torch.Generator, sampled: bool) -> None:
        """Row b's numbers for the next round, as TreeRejection.draw draws them (greedy rows: none;
        host trees and the draft's top-w, whose children are deterministic: no children's rows)."""
        if not sampled:
            return
        exponentials_(self.noise[b : b + 1], generator)
        uniforms_(self.uniform[b : b + 1], generator)
        if not self.rnd.one_hot and self.rnd.draft_pick.races:
            exponentials_(self.kids_noise[b], generator)

    def begin(self) -> None:
        pass

    def _rows(self, level: int) -> slice:
        return slice(0, 1) if level == 0 else slice(1 + (level - 1) * self.w, 1 + level * self.w)

    def children_noise(self, level: int, rows: int) -> torch.Tensor | None:
        rnd = self.rnd
        if not rnd.draft_pick.races:  # draft_sampling = "argmax": every row's top-w
            return None
        kids = self.kids_noise[:, self._rows(level)]  # [B, rows, V]
        return torch.where(rnd.drawn_rows[:, None, None], kids, 1.0).reshape(-1, rnd.width)

    def keep_q(self, level: int, logq: torch.Tensor) -> None:
        if not self.rnd.draft_pick.races:  # deterministic children: the sibling walk reads no q
            return
        torch.exp(logq.view(self.rnd.batch, -1, self.rnd.width), out=self.q[:, self._rows(level)])

    def verify(self, rows: Rows, penalties, bad) -> tuple:
        """Greedy rows the greedy walk (their probs are one-hot, their children the top-w: the
        tree round's greedy walk), sampled rows the recursive walk over their drawn children, or
        over deterministic children (a host tree's, the hybrid proposer's rows whose tree is the
        lookup's, or the draft's top-w under draft_sampling = "argmax") the sibling walk (the tree
        round's for one-hot q).
        penalties, bad: the tree rows' (BatchLogitsRows.tree_rows)."""
        rnd, trees = self.rnd, self.rnd.trees
        b, width = rnd.batch, rnd.width
        argmax, probs = rnd.ops.warp(rnd.tree_logits.view(-1, width), rnd.target_params.params, penalties, bad)
        greedy = rnd.ops.greedy_walk(trees["children"], rows.ids, argmax.view(b, -1), rnd.num_drafts, rnd.k)
        if probs is None:
            return greedy
        if rnd.one_hot or not rnd.draft_pick.races:
            sampled = rnd.ops.sibling_walk(trees["children"], rows.ids, probs.view(b, -1, width), self.uniform,
                                           self.noise, rnd.num_drafts, rnd.k)
        else:
            at = (1 + trees["offset"]).clamp(max=self.q.shape[1] - 1)  # [B, n + 1] each tree row's expanded node
            sampled = rnd.ops.recursive_walk(trees["children"], trees["drawn"], rows.ids, probs.view(b, -1, width),
                                             self.q[self.seq, at], self.uniform, self.noise, rnd.num_drafts, rnd.k)
            hosted = rnd.drafter.host_rows  # hybrid's rows verifying the lookup's trie (None: no such rows)
            if hosted is not None:
                siblings = rnd.ops.sibling_walk(trees["children"], rows.ids, probs.view(b, -1, width), self.uniform,
                                                self.noise, rnd.num_drafts, rnd.k)
                sampled = tuple(torch.where(hosted.view(-1, *([1] * (g.dim() - 1))), h, g)
                                for h, g in zip(siblings, sampled))
        return tuple(torch.where(rnd.drawn_rows.view(-1, *([1] * (g.dim() - 1))), d, g)
                     for d, g in zip(sampled, greedy))


class BatchTreeDraftModel(BatchDraftModel):
    """The draft model drafting every row's tree (its BatchDraftModel part: prefill, `pending`,
    its cache row): the root's log q from its step over `pending`, each level's from its step over
    the frontier's tree rows in its own cache."""

    host_rows = None  # every row's tree is the model's (the hybrid part's hosted rows: batch_hybrid_tree.py)

    def root(self) -> torch.Tensor:
        """The draft's logits after each row's root into the round's draft_logits [B, width]; the
        start [B] its frontiers' rows sit past (its committed sequence, the root included)."""
        rnd = self.rnd
        rnd._step(1, self.pending, rnd.draft_logits[:, None], keep=1)
        return rnd.positions[1]

    def level(self, level: int, start: torch.Tensor) -> None:
        """The draft's logits at frontier `level`'s nodes into the round's level_logits [B, w, width]."""
        rnd = self.rnd
        rows = rnd.trees.level_rows(level, start)
        logits = rnd.models[1].step(rows, rnd.caches[1], rnd.step_ops[1])
        cols = min(logits.shape[-1], rnd.width)
        rnd.level_logits[..., :cols].copy_(logits[..., :cols])

    def draft(self) -> None:
        self.rnd.grow_trees()

    def commit(self, out: torch.Tensor, path: torch.Tensor, emitted: torch.Tensor,
               hosted: torch.Tensor | None = None) -> None:
        """Each row as TreeDraft.commit: the draft keeps the m - 2 accepted nodes it stepped (m =
        emitted; its last two ids wait in `pending`). Before the round's `last` moves. hosted [B]
        bool: the rows whose tree was the lookup's (the hybrid proposer's,
        core/round/batch_hybrid_tree.py): as TreeDraft.lookup_commit, one step over the pending
        pair and the round's first k tokens from where the round started (k + 2 rows; the other
        rows at the cache's scratch end), which keeps the pair and the m - 2 tokens after it."""
        rnd, k, steps = self.rnd, self.rnd.k, self.rnd.steps
        ahead = emitted[:, None]
        if hosted is not None:
            self.follow_ids[:, :2].copy_(self.pending)
            torch.clamp(out[:, :k], min=0, out=self.follow_ids[:, 2:])
            torch.sub(rnd.positions[1], 2, out=self.follow_start)  # root() stepped the pair
            self.follow_start.masked_fill_(hosted.logical_not(), rnd.capacity - (k + 2))
            step = rowsets.batch(self.follow_ids, self.follow_start, self.follow_positions)
            rnd.models[1].step(step, rnd.caches[1], rnd.step_ops[1], 1)  # its logits: nobody's
        if k > 1:
            draft = rnd.positions[1][:, None]
            dst = draft + steps[: k - 1]
            src = draft + rnd.trees["offset"].gather(1, path[:, : k - 1])
            keep = steps[: k - 1] < ahead - 2
            if hosted is not None:  # the follow step wrote those rows' chain
                keep = keep & hosted.logical_not()[:, None]
            rnd.step_ops[1].compact(rnd.caches[1], torch.where(keep, src, dst), dst)
        ids = torch.cat([rnd.feed[:, :1], out], 1)  # [B, k + 2] the root, then the round's tokens
        self.pending.copy_(ids.gather(1, ahead - 1 + rnd.pair_steps))
        rnd.positions[1].add_(emitted - 2)


class BatchTreeRound(BatchRound):
    """B rows of token-tree speculation (width w > 1, n nodes): a BatchRound (its host side,
    caches and positions) whose body drafts, verifies and commits trees. drafter(round): the part
    whose logits build each row's tree: BatchTreeDraftModel, or an EAGLE-3 head's
    (core/round/batch_head_tree.BatchHeadTree): root() and level() write the round's logits,
    commit() keeps what its next round reads."""

    def __init__(self, k: int, width_w: int, nodes: int, batch: int, width: int, vocab_size: int, gumbel: bool,
                 backend, target, drafter, rows: tuple[str, ...] = (), eos_ids=(), races: bool = True):
        # before BatchRound's: its caches take `reach`, its coupling, drafter and logits-row parts these
        self.tree_width, self.nodes, self.gumbel = width_w, nodes, gumbel
        super().__init__(k, batch, width, vocab_size, gumbel, backend, target, drafter, rows, eos_ids, races)
        z = dict(device=self.device)
        self.trees = BatchTrees(batch, k, width_w, nodes, self.device)
        self.tree_logits = torch.full((batch, nodes + 1, width), float("-inf"), dtype=torch.float32, **z)
        self.level_logits = torch.full((batch, width_w, width), float("-inf"), dtype=torch.float32, **z)
        self.target_params = RowParams(batch, nodes + 1, self.device, self.starts, "target_warp")  # the tree's rows
        self.level_params = RowParams(batch, width_w, self.device, self.starts, "level_warp")  # a level's frontier rows
        # the sampled rows: their children are drawn from q (a host tree's and the draft's top-w under
        # draft_sampling = "argmax" are deterministic: their walk the siblings')
        self.drawn_rows = torch.zeros(batch, dtype=torch.bool, **z)
        self.pair_steps = torch.arange(2, **z)  # `pending`'s two columns (k may be 1)
        # [B, k + 1] each row's root and accepted nodes' tree rows (0 past them): its logprobs' rows
        self.path_rows = torch.zeros(batch, k + 1, dtype=torch.long, **z)

    def _coupling(self, gumbel: bool):
        return BatchTreeGumbel(self) if gumbel else BatchTreeRejection(self)

    @property
    def target_rows_per(self) -> int:
        return self.nodes + 1

    @property
    def stage_columns(self) -> int:
        """The tree round's layout: out (k + 1) | drafts (k) | n | taken | ranks (k)."""
        return 3 * self.k + 3

    @property
    def reach(self) -> int:
        """The target writes the root and n nodes past its position, the draft its pending pair and
        (k - 1) w frontier nodes past its own (a head: its k + 1 extend rows and the frontiers past
        the target's)."""
        return max(self.k + 3, self.nodes + 2, 2 + (self.k - 1) * self.tree_width + 1)

    def shape_key(self) -> tuple:
        """As a chain batch's, and the level rows' warp flags. Which rows' trees draw their children
        is not in it: the selection reads each row's flag on the device (TreeStack.draws)."""
        return (*super().shape_key(), self.level_params.flags)

    def state(self) -> list[torch.Tensor]:
        return [self.positions, self.feed, self.generated, self.emitted, *self.drafter.state(), *self.coupling.state()]

    def start(self, b: int, prompt_ids: list[int], spec: SamplingSpec, seed: int, cut: bool = True) -> None:
        """As a chain batch's row, and its tree's settings: a sampled request's children are drawn
        (unless draft_sampling = "argmax" takes every row's top-w), under rejection coupling with
        its stepped nodes first (tree_round.TreeRound's choice for one request)."""
        super().start(b, prompt_ids, spec, seed, cut)
        self.level_params.set(b, draft_spec(spec, cut))
        drawn = not spec.greedy
        self.drawn_rows[b].fill_(drawn)
        # a host tree is the host's, selected by no tree_select: no recapture for its sampled rows
        self.trees.trees[b].sampled = drawn and not self.gumbel and not self.one_hot and self.draft_pick.races

    # -- the device program -----------------------------------------------------------------------

    def body(self) -> None:
        """One round for every row, no host sync."""
        self.held[:-1].copy_(self.positions)
        self.held[-1].copy_(self.generated)
        self.ops.count_drafts_rows(self.confident, self.budget, self.limit, self.generated, self.num_drafts)
        self.coupling.begin()
        self.drafter.draft()  # each row's tree: the model's (grow_trees) or the host's
        rows = self.trees.target_rows(self.positions[0])
        with self.drafter.reading():  # a head's tap copies the target's states of the tree's rows
            logits = self.models[0].step(rows, self.caches[0], self.step_ops[0])
        cols = min(logits.shape[-1], self.width)
        self.tree_logits[..., :cols].copy_(logits[..., :cols])
        # each tree row's penalties count the drafts on its path, min_tokens follows its depth
        penalties, bad = self.rows.tree_rows(rows)
        out, path, shown, taken = self.coupling.verify(rows, penalties, bad)
        self._commit(out, path, shown, taken)
        self.rows.commit(out, self.active)
        torch.where(self.active, self.positions, self.held[:-1], out=self.positions)
        torch.where(self.active, self.generated, self.held[-1], out=self.generated)

    def read_tree(self, staged: list[int]) -> tuple[bool, list[int]]:
        """As TreeRound.read_ids and read_ranks read one request's: whether the walk ended on a draw
        it accepted outside the tree (`taken`: the last token out a draft accepted), and the sibling
        index of each accepted node (0: the chain's choice)."""
        k = self.k
        return staged[2 * k + 2] == 1, [r for r in staged[2 * k + 3:] if r >= 0]

    def read_source(self, b: int, ranks: list[int] | None, accepted: int) -> tuple[str, int] | None:
        """The hybrid part's (its rows verify the lookup's trie or the model's tree: host_rows), else None."""
        drafter = self.drafter
        return drafter.read_source(b, ranks, accepted) if drafter.host_rows is not None else None

    def logprob_rows(self) -> tuple:
        """Each row's root and accepted nodes' target rows, in path order (rows past the path: the
        root's), [B (k + 1), width], and their warp's inputs (params, and the penalties and mask of
        those rows): what TreeRound.keep_path_rows keeps for one request's logprobs. Every tree row
        of a row has the row's params: its root's stand for its k + 1 rows."""
        b, k, width = self.batch, self.k, self.width
        rows = self.path_rows[:, :, None].expand(-1, -1, width)
        logits = self.tree_logits.gather(1, rows).view(-1, width)
        tree = self.target_params.params

        def per_row(values: torch.Tensor) -> torch.Tensor:
            return values.view(b, -1)[:, :1].expand(-1, k + 1).reshape(-1)

        params = WarpParams(*(per_row(getattr(tree, name)) for name in FIELDS))
        params.__dict__["log_min_p"] = per_row(tree.log_min_p)
        params.__dict__["flags"] = tree.flags  # known on the host: no sync
        penalties, bad = self.rows.last  # the tree rows' (BatchLogitsRows.tree_rows), gathered as the logits

        def on_path(values: torch.Tensor) -> torch.Tensor:
            return values.view(b, -1, width).gather(1, rows).view(-1, width)

        if penalties is not None:
            penalties = PenaltyRows(on_path(penalties.counts), on_path(penalties.seen))
        return logits, params, penalties, on_path(bad) if bad is not None and bad.dim() == 2 else bad

    def _logq(self, logits: torch.Tensor, params: RowParams, level: int) -> torch.Tensor:
        """The draft's warped log q [R, V] at `level`'s nodes (TreeDraft.logq, each row its own params)."""
        logq = self.ops.tree_logq(logits, params.params, self.bad)
        self.coupling.keep_q(level, logq)
        return logq

    def grow_trees(self) -> None:
        """Each row's tree from the drafter's logits (root, then each level), its children from
        its own log q, then its n best candidates, every row in one call a level: the model
        drafters' draft()."""
        ops, trees, w, b = self.ops, self.trees, self.tree_width, self.batch
        start = self.drafter.root()  # each row's frontier rows past its own start [B]
        logq = self._logq(self.draft_logits, self.draft_params, 0)
        tokens, values = ops.tree_children(logq, self.coupling.children_noise(0, 1), w)  # [B, w]
        ops.tree_expand(trees, 0, tokens, values, start, self.feed[:, 0])
        for level in range(1, self.k):
            self.drafter.level(level, start)
            logq = self._logq(self.level_logits.view(b * w, -1), self.level_params, level)
            tokens, values = ops.tree_children(logq, self.coupling.children_noise(level, w), w)  # [B w, w]
            ops.tree_expand(trees, level, tokens, values, start)
        ops.tree_select(trees, self.positions[0])  # the target's rows past each row's own position

    def _commit(self, out: torch.Tensor, path: torch.Tensor, shown: torch.Tensor, taken: torch.Tensor) -> None:
        """Each row as TreeRound.commit: m = emitted; the target keeps its root and the m - 1
        accepted nodes, the drafter what its next round reads (before `last` moves)."""
        k, steps = self.k, self.steps
        emitted = (out >= 0).sum(1)  # [B]
        ahead = emitted[:, None]
        target = self.positions[0][:, None]
        dst = target + 1 + steps
        self.step_ops[0].compact(self.caches[0], torch.where(steps < ahead - 1, target + path, dst), dst)
        self.drafter.commit(out, path, emitted)
        # the draft proposed a taken token at its depth (m - 1): shown there is it, not the tree's best
        shown = torch.where((taken[:, None] > 0) & (steps == ahead - 1), out[:, :k], shown)
        self.path_rows[:, 1:].copy_(path)
        # each accepted node's rank among its siblings, the drawn ones where the row's are drawn (the
        # tree round's ranks: core/sampling/bookkeeping.py's tree_commit)
        trees = self.trees
        drawn = trees.draws  # the rows whose children are drawn (BatchTreeRound.start)
        hosted = self.drafter.host_rows
        if hosted is not None:  # a hybrid row verifying its trie: the trie's children
            drawn = drawn & hosted.logical_not()
        ranks = path_ranks(self.path_rows, out, emitted, taken, trees["children"], trees["ids"].view(self.batch, -1),
                           trees["drawn"], drawn)
        torch.cat([out, shown, self.num_drafts.long()[:, None], taken.long()[:, None], ranks], dim=1,
                  out=self.stage_ids)
        self.feed[:, :1].copy_(out.gather(1, ahead - 1))
        self.positions[0].add_(emitted)
        self.emitted.copy_(emitted)
        self.generated.add_(emitted)
