"""Prompt lookup drafting every row's token tree (core/round/batch_tree.py's drafter part where
the proposer is `ngram`, tree_width > 1, at batch_size > 1).

The lookup tree of one request (core/round/host_tree.py's HostTree, core/drafters/ngram.py's
TreeLookup) with a batch dimension, as core/round/batch_lookup.py is the chain's: each row has its
own TreeLookup over its own prompt and committed tokens. Before each round the host asks every
row's lookup for its trie (every distinct continuation, up to its budget deep), packs each as
HostTree packs one (host_tree.pack_tree: the nodes' tokens, the tree rows' parents, children by
rank, depths, positions and tails relative to the row's committed prefix, the tree's depth) into
one row of a staged [B, ...] buffer, and copies it to the device in one queued copy
(core/round/staging.py). A row whose lookup found nothing (or that holds no prompt) packs the
root alone: n padding rows that no children table names, so its walk emits the target's token at
the root, as the single round's empty program (Mode.EMPTY) does over the root alone (its padding
rows cost their rows in the target's step, and their keys and values land past the position).

The body copies every row's tree into the round's stacked Tree buffers (BatchTrees) and adds
each row's target position to its rows, slots and tails: it reads only device buffers the host
wrote before the round, allocates nothing, and is idempotent (a capture's warm-ups may replay it).
`num_drafts` is each row's tree depth (the walk's limit: the host capped the lookup at the row's
budget, max_tokens included, as the single round's).

The children are a deterministic function of the committed sequence, so q is one-hot (`one_hot`):
greedy and Gumbel coupling follow the target's token; rejection
coupling walks the siblings (the sampled rows; greedy rows their greedy walk), and a row draws
only the target's noise row and its uniforms [k, w], what the single round draws for a lookup
tree (core/round/batch_tree.py's BatchTreeRejection). The next round's trees depend on this
round's tokens (`host_proposes`: the round's host_drafts), so the batch loop keeps one round in
flight (core/batch_decode.py).
"""

from __future__ import annotations

import contextlib

import torch

from specgen.core.drafters.ngram import TreeLookup
from specgen.core.round.host_tree import pack_lists, packed_sizes
from specgen.core.round.staging import host_tensor


class BatchLookupTree:
    """ngram_min, ngram_max: each row's TreeLookup's n-gram sizes ([proposer] ngram_min/max); its
    width and node budget are the round's."""

    one_hot = True  # the host drafts (q is one-hot)
    host_proposes = True  # from the round before: one round in flight
    runners: list = []  # no model the round keeps a cache of besides the target
    host_rows = None  # every row's tree is the host's (one_hot says so)

    def __init__(self, rnd, ngram_min: int, ngram_max: int):
        k, w, n, batch = rnd.k, rnd.tree_width, rnd.nodes, rnd.batch
        self.rnd, self.shape = rnd, (k, w, n)
        self.lookups = [TreeLookup(ngram_min, ngram_max, w, n) for _ in range(batch)]
        self.sizes = packed_sizes(k, w, n)
        self.empty = pack_lists([], k, w, n)  # the root alone (host): a row that found nothing
        # per row: its packed tree; written by the host in one copy before each round. The root
        # alone until then: a capture's warm-ups run the body first, and zeros are no tree
        self.staged = host_tensor(self.empty).to(rnd.device).repeat(batch, 1)
        self.slots = torch.arange(n + 1, device=rnd.device)  # row r's slot past the prefix (static)

    def start(self, b: int, ids: list[int]) -> None:
        """Row b's prompt: the target's cache row (all but the last id) and row b's lookup."""
        self.rnd._prefill(0, b, ids[:-1])
        self.lookups[b].start(ids)

    def room(self, slots: int, capacity: int) -> None:
        """No cache of its own."""

    def propose(self, budgets: list[int]) -> None:
        """Every row's tree for the next round, up to its budget deep (0: a free row's, the root
        alone), from its lookup: one host buffer, one queued copy to the device."""
        flat = []
        for lookup, budget in zip(self.lookups, budgets):
            flat += pack_lists(lookup.lookup(budget), *self.shape) if budget > 0 else self.empty
        self.staged.copy_(self.rnd.staging.put(host_tensor(flat).view(len(budgets), -1)))

    def follow(self, b: int, committed: list[int]) -> None:
        """Row b's committed tokens of a round, which its next lookup reads."""
        self.lookups[b].follow(committed)

    def draft(self) -> None:
        """Every row's staged tree into the round's trees, its rows past its own target position,
        and its depth into num_drafts (HostTree.draft over [B, ...])."""
        place_staged(self.rnd, self.staged, self.sizes, self.slots)

    def reading(self):
        """What it reads of the target's step: nothing."""
        return contextlib.nullcontext()

    def commit(self, out: torch.Tensor, path: torch.Tensor, emitted: torch.Tensor) -> None:
        """No cache of its own to keep: the host's lookups follow the committed tokens."""

    def state(self) -> list[torch.Tensor]:
        """Nothing the body writes outlives the round but the round's own buffers."""
        return []

    def close(self) -> None:
        pass


def place_staged(rnd, staged: torch.Tensor, sizes: list[int], slots: torch.Tensor,
                 rows: torch.Tensor | None = None) -> None:
    """Each row's packed tree (staged [B, ...]: host_tree.pack_tree's parts) into the round's
    stacked trees, its rows past its own target position, and its depth into num_drafts. rows [B]
    bool: only those rows' (the hybrid proposer's rows whose lookup matched; the others keep the
    model's tree, each part chosen per row), None: every row's, written in place."""
    k, w, n, batch = rnd.k, rnd.tree_width, rnd.nodes, rnd.batch
    trees = rnd.trees
    ids, parents, children, depth, positions, path, limit = staged.split(sizes, dim=1)
    start = rnd.positions[0][:, None]  # [B, 1]
    tree_ids = trees["ids"][:, 0]  # [B, n + 1]
    tree_path = trees["path"][:, 0]
    if rows is None:
        tree_ids[:, :1].copy_(rnd.feed[:, :1])
        tree_ids[:, 1:].copy_(ids)
        trees["parents"].copy_(parents)
        trees["children"].copy_(children.view(batch, n + 1, w))
        trees["depth"][:, 0].copy_(depth)
        torch.add(positions, start, out=trees["positions"][:, 0])
        torch.add(slots, start, out=trees["slots"][:, 0])
        torch.add(path.view(batch, n + 1, k + 1), start[:, :, None], out=tree_path)
        rnd.num_drafts.copy_(limit[:, 0])
        return
    parts = ((tree_ids[:, 1:], ids), (trees["parents"], parents), (trees["children"], children.view(batch, n + 1, w)),
             (trees["depth"][:, 0], depth), (trees["positions"][:, 0], positions + start),
             (trees["slots"][:, 0], slots + start), (tree_path, path.view(batch, n + 1, k + 1) + start[:, :, None]),
             (rnd.num_drafts, limit[:, 0].int()))
    for out, value in parts:
        torch.where(rows.view(-1, *[1] * (out.dim() - 1)), value, out, out=out)
