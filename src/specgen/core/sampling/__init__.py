"""The torch references of a round's sampling: the warp (temperature, top-k/p, min-p, penalties),
rejection and greedy verification, Gumbel noise, and the round's bookkeeping (draft count, commit)."""
