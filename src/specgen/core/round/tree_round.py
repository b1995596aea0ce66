"""The round with a token tree (speculation.tree_width > 1): the chain round's host side and
buffers, with a tree drafter, tree verification and a commit that compacts both caches.

    draft    the host's lookup tree (core/round/host_tree.py: the ngram proposer's), or the draft
             model steps over `pending` (the root's children: level 1), then once per
             level over the frontier's w nodes, tree rows over its own cache (core/round/tree.py);
             an EAGLE-3 head or an MTP layer likewise after its extend (core/round/head_tree.py); the hybrid
             proposer's where the lookup finds continuations: the model's tree merged with the
             lookup's (core/round/merged_tree.py), or the lookup's alone, the model following
             (core/drafters/merge_rule.py chooses)
    select   the n best candidates by cumulative draft log-probability, as tree rows
    target   one step over the root and the n nodes (core/step/rows.tree)
    verify   the walk from the root (core/sampling/tree_walk.py, through the round's ops table: one
             kernel on CUDA): greedy and Gumbel coupling follow the target's token, rejection
             coupling walks siblings (drawn children recursively, a merged tree's lookup lanes
             as point masses first)
    commit   one op of the round's table (core/sampling/bookkeeping.py's tree_commit: one kernel on
             CUDA) stages the ids as a chain round stages them (out | the drafts the walk followed
             | drafts that count), then `taken`: 1 where the walk ended on a drawn child it
             accepted outside the tree (the drafts staged show that token at its depth), which the
             host counts as accepted, then each accepted node's sibling index (which branch won,
             core/round/tree_stage.py); it writes the slots each cache's compaction moves, the
             next round's inputs and the positions. Then the accepted path's K/V moves to the
             slots after each cache's committed prefix (the step's `compact` op), so the next
             round starts as after a chain
    stage    with insight, the tree itself (core/round/tree_stage.py's TreeInsight)

Every shape is fixed by (k, width, nodes): no host sync, nothing the next round needs is
allocated. A width of 1 never comes here: that is the chain round (core/round/round.py).

The body is one function of the mode's drafter and envelope (Envelope: a Tree, the target's rows
of logits over it, their warp's parameters, the insight stage): the model's and the lookup's
trees share one of n nodes; the ngram proposer's round has a second of the root alone, for
rounds whose lookup found nothing (Mode.EMPTY, a program of its own, captured as the others):
the target steps over one row instead of n + 1, the walk over the root emits the target's token
(no drafts, as target-only), and the commit moves nothing (the root's K/V is in place). On an
H200 with the bench pair a 9-row target step took 0.43 ms against 5 rows' 0.32.
"""

from __future__ import annotations

import torch

from specgen.core.round.couplings import GumbelCoupling
from specgen.core.round.drafters import draft_spec
from specgen.core.round.head_tree import HeadTreeDraft
from specgen.core.round.host_tree import HostTree, ModelFollower
from specgen.core.round.merged_tree import MergedTree
from specgen.core.round.round import Mode, Round
from specgen.core.round.rows import MinTokens, Penalties
from specgen.core.round.tree import Tree
from specgen.core.round.tree_stage import NoTreeStage, TreeInsight, path_source
from specgen.core.sampling.bookkeeping import TreeCommitBuffers
from specgen.core.sampling.warp import PenaltyRows, WarpParams, exponentials_, uniforms_


class TreeDraft:
    """The draft model (its DraftModel part: prefill, `pending`, the runner) drafting a tree."""

    one_hot = False
    point = None  # no point-mass lanes: drawn children, or the top-w

    def __init__(self, rnd, chain, tree: Tree, params: WarpParams, bad, coupling):
        self.rnd, self.chain, self.tree, self.params, self.bad = rnd, chain, tree, params, bad
        self.coupling = coupling
        self.runners = chain.runners
        self.level_logits = torch.full((tree.w, rnd.width), float("-inf"), dtype=torch.float32, device=rnd.device)
        self.confident = torch.ones(rnd.k, dtype=torch.bool, device=rnd.device)
        # [1, 2, k - 1] the compaction's sources and destinations, which the round's commit op writes
        self.slots = torch.zeros(1, 2, rnd.k - 1, dtype=torch.long, device=rnd.device) if rnd.k > 1 else None

    def prefill(self, ids: list[int]) -> None:
        self.chain.prefill(ids)

    def logq(self, logits: torch.Tensor, level: int) -> torch.Tensor:
        """The draft's warped log q at the nodes of `level` (0: the root), whose top-w are their
        children (or from which they are drawn: the coupling keeps q where it verifies with it)."""
        logq = self.rnd.ops.tree_logq(logits, self.params.slice(0, logits.shape[0]), self.bad)
        self.coupling.keep_q(level, logq)
        return logq

    def draft(self) -> None:
        rnd, runner, tree, pending = self.rnd, self.chain.runner, self.tree, self.chain.pending[0]
        logits = self.chain.logits[2]
        with runner.step_context(2):
            runner.step(pending, logits)
        noise, ops = self.coupling.children_noise, rnd.ops
        start = runner.position.view(1)  # past the committed sequence, the root included
        tree.root(rnd.feed[0, :1], self.logq(logits[1:], 0), noise(0), start, ops)
        for level in range(1, rnd.k):
            runner.step_rows(tree.level_rows(level, start), self.level_logits)
            tree.expand(level, self.logq(self.level_logits, level), noise(level), start, ops)
        tree.select(rnd.target.position.view(1), ops)  # the target's rows past its own position
        rnd.ops.count_drafts(self.confident, rnd.budget, rnd.limit, rnd.generated, rnd.num_drafts)

    def commit(self, out: torch.Tensor, bookkeep) -> None:
        """The draft keeps the m - 2 accepted nodes it stepped (m = emitted; its last two ids wait
        in `pending`): the round's bookkeeping (TreeRound.commit) writes its compaction's slots,
        its pending pair and its position (moved by m - 2: it ran the pending pair)."""
        draft = self.chain.runner
        slots = dict(offset=self.tree.stack.offset, draft_slots=self.slots) if self.slots is not None else {}
        bookkeep(draft_position=draft.position.view(1), pending=self.chain.pending, ran=2, **slots)
        if self.slots is not None:
            draft.compact(self.slots[0, 0], self.slots[0, 1])

    def merged_commit(self, out: torch.Tensor, bookkeep) -> None:
        """A merged tree's round (core/round/merged_tree.py), at its commit: draft() stepped the
        pending pair (the position moved past it) and the frontier; one step over the round's
        first k tokens past the pair (k rows, over the frontier's slots) keeps the rows of the m - 2
        tokens before the last two (m = emitted), which then wait in `pending` (the round's
        bookkeeping writes it and moves the position by m - (k + 2)): what a model round's commit
        leaves after the same tokens, whichever part of the tree the path went through. Rows past
        those (the round's last two tokens, and -1 past the emitted ones, read as id 0) are junk
        past the position, which later steps overwrite, as a model round's rejected drafts'."""
        k, draft, chain = self.rnd.k, self.chain.runner, self.chain
        ids = chain.follow_ids[2:]
        torch.clamp(out[:k], min=0, out=ids)
        with draft.step_context(k):
            draft.step(ids, chain.logits[k + 2][:k])
        bookkeep(draft_position=draft.position.view(1), pending=chain.pending, ran=k + 2)

    def follow(self) -> None:
        """A hybrid round over the lookup's trie alone (core/round/host_tree.py's ModelFollower):
        nothing before the target's step; lookup_commit steps over the round's tokens."""

    def lookup_commit(self, out: torch.Tensor, bookkeep) -> None:
        """That round's commit: draft() did not run, so one step over the pending pair and the
        round's first k tokens (k + 2 rows from the position) keeps the rows of the pair and the
        first m - 2 tokens, the last two then waiting in `pending`, with the bookkeeping of
        merged_commit, which stepped the same rows in two calls: the cache is a chain's after the
        same tokens."""
        k, draft, chain = self.rnd.k, self.chain.runner, self.chain
        ids = chain.follow_ids
        ids[:2].copy_(chain.pending[0])
        torch.clamp(out[:k], min=0, out=ids[2:])
        with draft.step_context(k + 2):
            draft.step(ids, chain.logits[k + 2])
        bookkeep(draft_position=draft.position.view(1), pending=chain.pending, ran=k + 2)

    def state(self) -> list[torch.Tensor]:
        return self.chain.state()


class TreeRows:
    """The warp's penalties and masks per tree row, from the round's chain processors
    (core/round/rows.py): a row counts the drafted tokens on its path (its ancestors below the root,
    and its own), and min_tokens masks the stop ids in the rows whose depth is still short of it."""

    def __init__(self, rnd, rows):
        self.rnd, self.penalties, self.mask = rnd, rows.penalties, rows.mask

    def target_rows(self, tree: Tree, rows) -> tuple:
        return self._penalties(tree, rows), self._bad(rows)

    def _penalties(self, tree: Tree, rows) -> PenaltyRows | None:
        if not isinstance(self.penalties, Penalties):
            return None
        counts = self.penalties.counts
        path = rows.tail[0] - rows.start[0]  # [n+1, L] tree rows from the root down to each row
        steps = torch.arange(path.shape[1], device=path.device)
        drafted = ((steps > 0) & (steps < rows.depth[0][:, None])).int()  # the root is counted already
        cum = torch.zeros(path.shape[0], counts.shape[0], dtype=torch.int32, device=counts.device)
        cum.scatter_add_(1, tree.ids[0][path], drafted)
        return PenaltyRows(counts + cum, self.penalties.seen | (cum > 0))

    def _bad(self, rows) -> torch.Tensor | None:
        if not isinstance(self.mask, MinTokens):
            return self.mask.padding
        short = (self.rnd.generated + rows.depth[0] - 1) < self.mask.min_tokens  # [n+1]
        bad = short[:, None] & self.mask.stop_cols
        return bad if self.mask.padding is None else bad | self.mask.padding


class TreeRejection:
    """Greedy: the walk follows the target's argmax. Sampled: from uniforms [k, w] and one Exp(1)
    row the host draws before each round, the sibling walk over deterministic children, or, where
    the children are drawn (`drawn`), the recursive walk over them, whose Exp(1) rows (one per node
    the draft expands: the root, then each level's frontier) the host draws too, and whose q per
    expanded node the drafter keeps here."""

    def __init__(self, rnd, sampled: bool, width: int, drawn: bool):
        z = dict(dtype=torch.float32, device=rnd.device)
        self.rnd, self.sampled, self.w = rnd, sampled, width
        self.noise = torch.ones(1, rnd.width, **z) if sampled else None
        self.uniform = torch.ones(1, rnd.k, width, **z) if sampled else None
        expanded = 1 + (rnd.k - 1) * width
        self.kids_noise = torch.ones(expanded, rnd.width, **z) if drawn else None
        self.q = torch.zeros(expanded, rnd.width, **z) if drawn else None

    def start(self, seed: int, origin: int) -> None:
        """The caller's generator draws the numbers: nothing to key."""

    def draw(self, generator: torch.Generator) -> None:
        if self.sampled:
            exponentials_(self.noise, generator)
            uniforms_(self.uniform, generator)
        if self.kids_noise is not None:
            exponentials_(self.kids_noise, generator)

    def begin(self) -> None:
        pass

    def _rows(self, level: int) -> slice:
        """The expanded nodes of `level` (0: the root; then a level's w frontier nodes)."""
        return slice(0, 1) if level == 0 else slice(1 + (level - 1) * self.w, 1 + level * self.w)

    def children_noise(self, level: int) -> torch.Tensor | None:
        return None if self.kids_noise is None else self.kids_noise[self._rows(level)]

    def keep_q(self, level: int, logq: torch.Tensor) -> None:
        if self.q is not None:
            torch.exp(logq, out=self.q[self._rows(level)])

    def verify(self, env: "Envelope", rows, penalties, bad, one_hot: bool, point=None) -> tuple:
        """The walk over env's tree and the target's rows of it. one_hot: the host drafted the
        tree (its children are deterministic, whatever the draft's would be): the sibling walk.
        point [n + 1, w]: a merged tree's point-mass lanes (the lookup's), walked first at each
        node where the children are drawn; with the top-w every child is a point mass."""
        rnd, tree = self.rnd, env.tree
        argmax, probs = rnd.ops.warp(env.logits, env.params, penalties, bad)
        if probs is None:
            return rnd.ops.greedy_walk(tree.children[None], tree.ids, argmax[None], rnd.num_drafts, rnd.k)
        if self.q is None or one_hot:
            return rnd.ops.sibling_walk(tree.children[None], tree.ids, probs[None], self.uniform, self.noise,
                                        rnd.num_drafts, rnd.k)
        q = self.q.index_select(0, (1 + tree.offset).clamp(max=self.q.shape[0] - 1))  # [n+1, V] by tree row
        return rnd.ops.recursive_walk(tree.children[None], tree.drawn[None], tree.ids, probs[None], q[None],
                                      self.uniform, self.noise, rnd.num_drafts, rnd.k,
                                      point=None if point is None else point[None])


class TreeGumbel(GumbelCoupling):
    """The target's token at each node is its race against the noise row of the node's absolute
    position (its depth past the root): the walk follows it, so the text is target-only's. Drawn
    children (`drawn`) are drawn with the same row: a node's first child is the draft's own race
    there, the guess a Gumbel-coupled chain makes."""

    def __init__(self, rnd, nodes: int, drawn: bool):
        super().__init__(rnd, draft_races=False)
        self.drawn = drawn
        self.tree_choice = torch.zeros(nodes + 1, dtype=torch.long, device=rnd.device)

    def children_noise(self, level: int) -> torch.Tensor | None:
        """The children of `level`'s nodes (0: the root) sit at depth level + 1: noise row `level`."""
        return self.noise[level : level + 1] if self.drawn else None

    def keep_q(self, level: int, logq: torch.Tensor) -> None:
        """The walk follows the target's race: it never reads q."""

    def verify(self, env: "Envelope", rows, penalties, bad, one_hot: bool, point=None) -> tuple:
        rnd, tree = self.rnd, env.tree
        noise = self.noise.index_select(0, rows.depth[0] - 1)  # [n+1, V]: each row's position's
        choice = self.tree_choice[: tree.n + 1]  # env's rows (the root alone in an empty round)
        rnd.ops.warp_and_race(env.logits, env.params, noise, choice, penalties, bad)
        return rnd.ops.greedy_walk(tree.children[None], tree.ids, choice[None], rnd.num_drafts, rnd.k)


class Envelope:
    """What a tree round verifies over, allocated once: a Tree of n nodes, the target's rows of
    logits over it (the root and the n nodes, as the step wrote them), the warp's parameters for
    those rows, and with insight the stage of that tree. A TreeRound has one for its trees (the
    model's and the lookup's), and the ngram proposer's round one of no node besides the root
    (`TreeRound.envelopes`): a lookup that found nothing runs that, a target step over one row."""

    def __init__(self, rnd, spec, n: int, drawn: bool, insight: bool, out: torch.Tensor | None = None):
        k, w = rnd.k, rnd.shape.tree_width
        self.tree = Tree(k, w, n, rnd.device, drawn=drawn)
        self.logits = torch.full((n + 1, rnd.width), float("-inf"), dtype=torch.float32, device=rnd.device)
        self.params = WarpParams.from_spec(spec, n + 1, rnd.device)
        self.stage = TreeInsight(rnd, self, out) if insight else NoTreeStage(rnd)


class TreeRound(Round):
    """A Round (its buffers, host side and parts) whose drafter, coupling and commit are the
    tree's; `target_logits` holds the accepted path's rows after each round."""

    def __init__(self, shape, spec, backend, target, draft, stop_ids: list[int], head=None):
        super().__init__(shape, spec, backend, target, draft, stop_ids, head)
        k, w, n = shape.k, shape.tree_width, shape.tree_nodes
        # sampled requests draw the children from q (speculation.draft_sampling; greedy requests
        # and "argmax" take the top-w)
        drawn = shape.draft_pick != "argmax" and not spec.greedy
        insight = "insight" in shape.stages
        full = Envelope(self, spec, n, drawn and shape.coupling != "gumbel", insight)
        # the tree's buffers, the target's rows as the step wrote them (target_logits, k + 1 rows,
        # gets the accepted path's, in order, where the host reads logprobs as after a chain
        # round) and their warp's parameters: the model's and the lookup's trees'
        self.tree, self.tree_logits, self.params = full.tree, full.logits, full.params
        self.coupling = TreeGumbel(self, n, drawn) if shape.coupling == "gumbel" else \
            TreeRejection(self, not spec.greedy, w, drawn)
        self.tree_rows = TreeRows(self, self.rows)
        # the draft scores children without penalties or min_tokens: any deterministic children, and
        # any q that drawn children come from, are lossless, and the target's rows apply both
        draft_params = WarpParams.from_spec(draft_spec(spec, shape.draft_pick != "temperature"), w, self.device)
        # the chain's layout and more: [out (k+1) | drafts (k) | n | taken | ranks (k)] (before the
        # drafters: an EAGLE-3 head reads the last round's out here)
        self.stage_ids = torch.zeros(3 * k + 3, dtype=torch.long, device=self.device)
        self.path_rows = torch.zeros(k + 1, dtype=torch.long, device=self.device)  # [k+1] the root, the path
        self.target_slots = torch.zeros(1, 2, k, dtype=torch.long, device=self.device)  # its compaction's src, dst
        self.drafters = self._tree_drafters(shape, draft_params)
        self.drafter = self.drafters.get(Mode.MODEL, self.drafters[Mode.HOST])  # the one that prefills
        self.envelopes = {mode: full for mode in self.drafters}
        if shape.drafter == "none":
            # the ngram proposer's round where its lookup found nothing (Mode.EMPTY): a host tree of
            # the root alone, which its HostTree stages once and never changes, so the target steps
            # over one row (a lookup tree's round steps over the n padding rows too); its insight
            # writes the first of the full tree's staged floats, which the host copies (stage_f)
            empty = Envelope(self, spec, 0, False, insight, full.stage.out if insight else None)
            self.envelopes[Mode.EMPTY] = empty
            self.drafters[Mode.EMPTY] = HostTree(self, empty.tree, self.drafters[Mode.HOST].follower)
        self.stage = full.stage

    def _tree_drafters(self, shape, draft_params: WarpParams) -> dict:
        """The drafter part of each mode: the host's lookup tree (HOST: the ngram proposer's), and
        where a model drafts, its tree (MODEL): the draft model's, or the head's
        (core/round/head_tree.py) where an EAGLE-3 head or an MTP layer drafts. The hybrid
        proposer's rounds whose lookup found continuations merge the lookup's trie with the
        model's tree (MERGED: core/round/merged_tree.py) or verify the trie alone, the model
        following (HOST), as core/drafters/merge_rule.py chooses; where its lookup finds nothing,
        the model's tree is the round's, so only the ngram proposer's round has an empty one
        (Mode.EMPTY, __init__)."""
        if shape.drafter == "none":
            return {Mode.HOST: HostTree(self, self.tree, self.drafter)}
        if shape.drafter in ("eagle", "mtp"):
            model = HeadTreeDraft(self, self.drafter, self.tree, draft_params, self.rows.mask.padding, self.coupling)
        else:
            model = TreeDraft(self, self.drafter, self.tree, draft_params, self.rows.mask.padding, self.coupling)
        return {Mode.MODEL: model, Mode.HOST: HostTree(self, self.tree, ModelFollower(model)),
                Mode.MERGED: MergedTree(self, self.tree, model)}

    @property
    def reach(self) -> int:
        """The target writes the root and n nodes past its position, the draft its pending pair
        and (k - 1) w frontier nodes past its own."""
        tree = self.tree
        return max(self.k + 3, tree.n + 2, 2 + (self.k - 1) * tree.w + 1)

    def _stage(self, insight: bool, spec) -> NoTreeStage:
        return NoTreeStage(self)  # the tree's own, once the tree is built (__init__)

    def body(self, mode: Mode, mark) -> None:
        """One algorithm for every mode: the mode's drafter writes its envelope's tree (an empty
        round's: the root alone), the target steps over that tree's rows, the walk and commit."""
        drafter, env = self.drafters[mode], self.envelopes[mode]
        tree = env.tree
        mark()
        self.coupling.begin()
        drafter.draft()
        mark()
        rows = tree.target_rows(self.target.position.view(1))
        self.target.step_rows(rows, env.logits)
        mark()
        penalties, bad = self.tree_rows.target_rows(tree, rows)
        # a host tree's children are one-hot whatever the model's would be: its walk is the siblings'
        one_hot = drafter.one_hot
        out, path, shown, taken = self.coupling.verify(env, rows, penalties, bad, one_hot, drafter.point)
        self.commit(drafter, tree, out, path, shown, taken, drawn=tree.sampled and not one_hot)
        ranks = self.stage_ids[2 * self.k + 3 :]  # as the commit staged them
        env.stage.stage(out[0], path[0], taken[0], ranks, penalties, bad, one_hot, drafter.point)
        self.keep_path_rows(env.logits, penalties, bad)
        self.rows.penalties.commit(out[0])
        mark()

    def keep_path_rows(self, logits: torch.Tensor, penalties: PenaltyRows | None, bad) -> None:
        """The root's and the accepted nodes' logits (of the round's tree rows `logits`) and warp
        rows, in path order (rows past the path hold the root's): what the host's logprobs read
        (core/decode.py). After the commit, which wrote the rows."""
        rows = self.path_rows  # [k+1] tree rows
        torch.index_select(logits, 0, rows, out=self.target_logits)
        if penalties is not None:
            penalties = PenaltyRows(penalties.counts[rows], penalties.seen[rows])
        self.rows.last = (self.rows.params, penalties, bad[rows] if bad is not None and bad.dim() == 2 else bad)

    def commit(self, drafter, tree: Tree, out: torch.Tensor, path: torch.Tensor, shown: torch.Tensor,
               taken: torch.Tensor, drawn: bool) -> None:
        """The walk's out [1, k+1], path, shown [1, k] and taken [1] committed: m = emitted tokens.
        The round's drafter (TreeDraft.commit, HeadTreeDraft.commit, HostTree.commit: its
        follower's follow_commit, MergedTree.commit: its model's merged_commit) does its own part
        around `bookkeep`, which it calls once with its buffers: the round's bookkeeping in one op
        (core/sampling/bookkeeping.py's tree_commit: the staged ids and ranks, the path's rows, the
        compactions' slots, the next round's inputs, every position; drawn: the ranks are among
        the tree's drawn children), then the target's compaction, which keeps the root and the
        m - 1 accepted nodes. A last token `taken` (a draw accepted outside the tree) has no K/V
        in any cache, as a recovered one."""
        target, slots = self.target, self.target_slots

        def bookkeep(**draft) -> None:
            self.ops.tree_commit(TreeCommitBuffers(
                out=out, path=path, shown=shown, taken=taken, children=tree.stack.children, tokens=tree.ids,
                drawn=tree.stack.drawn if drawn else None, num_drafts=self.num_drafts,
                stage=self.stage_ids.view(1, -1), rows=self.path_rows.view(1, -1), feed=self.feed,
                target_position=target.position.view(1), emitted=self.emitted.view(1),
                generated=self.generated.view(1), target_slots=slots, **draft))
            target.compact(slots[0, 0], slots[0, 1])

        drafter.commit(out[0], bookkeep)

    def read_ids(self, values: list[int]) -> tuple[list[int], list[int], int, bool]:
        """As a chain's, and the last token out a draft where the walk took it outside the tree."""
        ids, drafted, n, _ = super().read_ids(values)
        return ids, drafted, n, values[2 * self.k + 2] == 1

    def read_ranks(self, values: list[int]) -> list[int]:
        """The sibling index of each accepted node (0: the chain's choice) from stage_ids' copy."""
        return [r for r in values[2 * self.k + 3:] if r >= 0]

    def read_source(self, ranks: list[int] | None, accepted: int, lookup) -> tuple[str, int] | None:
        """(whose nodes the accepted path took, the lookup's node count) where a model drafts beside
        a lookup (the hybrid proposer: `lookup` the LookupTree the host staged, empty in a model
        round); None otherwise (no lookup, or the ngram proposer's, every node the lookup's)."""
        if lookup is None or Mode.MODEL not in self.drafters:
            return None
        return path_source(ranks or [], accepted, lookup)

    def read_floats(self, floats: list[float], mode: Mode) -> tuple:
        """(p, q, entropy) per drafted id, as the mode's envelope staged them."""
        return self.envelopes[mode].stage.read(floats, self.drafters[mode].one_hot)

    def read_tree(self, floats: list[float], mode: Mode = Mode.MODEL):
        """The round's TreeView from stage_f's copy, as the mode's envelope staged it (None without
        insight; an empty round's: the root alone, no path)."""
        return self.envelopes[mode].stage.view(floats)
