"""The hybrid proposer's token trees at batch (core/round/batch_tree.py's drafter part where the
proposer is `hybrid`, tree_width > 1, at batch_size > 1): each row the lookup's trie alone where
its lookup found continuations, else the model's tree (the draft model's, or an EAGLE-3 head's).

Alone, hybrid's tree rounds take turns by round (core/decode.py, hybrid_merge = "never": the
default, core/drafters/merge_rule.py): a round whose lookup (core/drafters/ngram.py's TreeLookup of
n - 1 nodes, its root w - 1 wide, as the engine builds it for hybrid) finds continuations verifies
that trie alone, the model following (core/round/host_tree.py's ModelFollower); any other round
verifies the model's tree. At batch every row takes its own turn in one round, as the hybrid
chain's rows do (core/round/batch_hybrid.py):

    propose  the host asks every row's lookup for its trie, up to its budget deep, and packs it
             (host_tree.pack_tree) with the model's budget into one staged buffer, one copy
    draft    the model grows every row's tree (BatchTreeRound.grow_trees), then each row whose
             lookup found continuations (its trie's depth > 0: `hosted`) takes its trie and depth
             instead, chosen per row on the device (batch_lookup_tree.place_staged)
    verify   greedy and Gumbel coupling: every row's greedy walk (the target's token); rejection
             coupling: hosted sampled rows walk their trie's siblings (one-hot q), the model's
             rows their drawn children (core/round/batch_tree.py's BatchTreeRejection)
    commit   the draft model: the model's rows compacted, the hosted rows stepped over their pair
             and tokens (BatchTreeDraftModel.commit, as TreeDraft.lookup_commit); a head: every
             row's path gathered from the tap, as alone (its draft's extend is its follow)

Each row draws what it draws alone: rejection coupling's hybrid round draws the children's rows
every round, whoever drafts (TreeRejection.draw), and a hosted row's model tree is built from them
and then dropped. So greedy, Gumbel and rejection coupling give each row the tokens it gets alone.
The next round's tries depend on this round's tokens (`host_proposes`): one round in flight.
hybrid_merge auto or always (merged trees) is not taken at batch (engine.batch_refusal).
"""

from __future__ import annotations

import torch

from specgen.core.drafters.ngram import LookupTree, TreeLookup
from specgen.core.round.batch_lookup_tree import place_staged
from specgen.core.round.host_tree import pack_lists, packed_sizes
from specgen.core.round.staging import host_tensor
from specgen.core.round.tree_stage import path_source


class BatchHybridTree:
    """model(round): the part whose tree a row verifies where its lookup finds nothing
    (BatchTreeDraftModel, or BatchHeadTree); ngram_min, ngram_max: each row's TreeLookup's n-gram
    sizes ([proposer] ngram_min/max)."""

    one_hot = False  # the model's rows draw their children: every row draws their noise rows
    host_proposes = True  # the host's lookups, from the round before: one round in flight

    def __init__(self, rnd, model, ngram_min: int, ngram_max: int):
        k, w, n, batch = rnd.k, rnd.tree_width, rnd.nodes, rnd.batch
        self.rnd, self.model = rnd, model(rnd)
        self.runners = self.model.runners
        self.shape = (k, w, n)
        self.lookups = [TreeLookup(ngram_min, ngram_max, w, n - 1, root_width=w - 1) for _ in range(batch)]
        self.sizes = packed_sizes(k, w, n)
        self.empty = pack_lists([], k, w, n)  # a row whose lookup found nothing: depth 0, the model's row
        # per row: its packed trie, then the model's budget; the root alone until the host sets one
        self.staged = host_tensor(self.empty + [0]).to(rnd.device).repeat(batch, 1)
        self.slots = torch.arange(n + 1, device=rnd.device)  # row r's slot past the prefix (static)
        self.hosted = torch.zeros(batch, dtype=torch.bool, device=rnd.device)  # the rows verifying their trie
        self.found = [LookupTree() for _ in range(batch)]  # each row's trie of the round in flight (one)

    def start(self, b: int, ids: list[int]) -> None:
        """Row b's prompt: the model part's prefill and row b's lookup."""
        self.model.start(b, ids)
        self.lookups[b].start(ids)

    def room(self, slots: int, capacity: int) -> None:
        self.model.room(slots, capacity)

    def propose(self, budgets: list[int]) -> None:
        """Every row's trie for the next round, up to its budget deep (0: none), and the model's
        budget: one host buffer, one queued copy, the budgets copied from it on the device."""
        self.found = [lookup.lookup(budget) if budget > 0 else LookupTree() for lookup, budget in zip(self.lookups, budgets)]
        flat = []
        for found, budget in zip(self.found, budgets):
            flat += (pack_lists(found, *self.shape) if found else self.empty) + [budget]
        self.staged.copy_(self.rnd.staging.put(host_tensor(flat).view(len(budgets), -1)))
        self.rnd.budget.copy_(self.staged[:, -1])

    def follow(self, b: int, committed: list[int]) -> None:
        """Row b's committed tokens of a round, which its next lookup reads."""
        self.lookups[b].follow(committed)

    def root(self) -> torch.Tensor:
        """The model's part of grow_trees (BatchTreeRound.grow_trees asks the round's drafter)."""
        return self.model.root()

    def level(self, level: int, start: torch.Tensor) -> None:
        self.model.level(level, start)

    def draft(self) -> None:
        """The model's tree for every row, then each hosted row's trie in its place."""
        self.model.draft()
        trie = self.staged[:, :-1]
        torch.gt(trie[:, -1], 0, out=self.hosted)  # the trie's depth: 0 where the lookup found nothing
        place_staged(self.rnd, trie, self.sizes, self.slots, rows=self.hosted)

    @property
    def host_rows(self) -> torch.Tensor:
        """The rows whose tree is deterministic (their trie's): rejection coupling walks their
        siblings (core/round/batch_tree.py's BatchTreeRejection.verify)."""
        return self.hosted

    def read_source(self, b: int, ranks: list[int] | None, accepted: int) -> tuple[str, int]:
        """Whose nodes row b's accepted path took ("lookup", "model", "none") and its trie's node
        count: what one request's hybrid tree round records (tree_stage.path_source; the round in
        flight is the one its trie was proposed for)."""
        return path_source(ranks or [], accepted, self.found[b])

    def reading(self):
        return self.model.reading()

    def commit(self, out: torch.Tensor, path: torch.Tensor, emitted: torch.Tensor) -> None:
        self.model.commit(out, path, emitted, hosted=self.hosted)

    def state(self) -> list[torch.Tensor]:
        return self.model.state()

    def close(self) -> None:
        self.model.close()
