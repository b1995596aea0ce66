"""The round, composed of parts: core/round/round.py holds the shared buffers and the body; each
part is a small class with its own buffers (drafters.py, draft_model.py, head.py, couplings.py,
rows.py, stage.py; a token tree's: tree.py, tree_round.py). A new drafter or coupling is a new
part, never a new flag on the round."""

from specgen.core.round.drafters import draft_spec
from specgen.core.round.round import Mode, Round, RoundShape
from specgen.core.round.tree_round import TreeRound

__all__ = ["Mode", "Round", "RoundShape", "TreeRound", "draft_spec"]
