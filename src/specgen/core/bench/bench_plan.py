"""What `specgen bench` measures: the sweep and the baselines, without torch, so that the command
can check its options before it imports torch (core/bench/run.py measures)."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.core.settings import tree_envelope

BASELINES = ("target-only", "hf", "hf-static", "hf-assisted")
HF_BASELINES = ("hf", "hf-static")  # plain Hugging Face generate, without a draft


@dataclass(frozen=True)
class Plan:
    ks: tuple[int, ...]
    temperatures: tuple[float, ...]
    proposers: tuple[str, ...]  # proposer kinds measured side by side (each with every k)
    baselines: tuple[str, ...] = ("target-only",)
    repeat: int = 1
    warmup: int = 1
    records: bool = False  # keep per-round records of every speculative run (for inspect-acceptance)
    # sampled temperatures run once per coupling (greedy runs once: coupling changes nothing there)
    couplings: tuple[str, ...] = ("rejection",)
    # tree shapes (tree_width, tree_nodes) each k runs with; None: the profile's own
    trees: tuple[tuple[int, int] | None, ...] = (None,)

    def shapes(self, k: int) -> tuple[tuple[int, int] | None, ...]:
        """The tree shapes that fit depth k: a node budget past what a tree of that depth and width
        holds (or below k) is left out of that k's runs."""
        return tuple(tree for tree in self.trees if fits(k, tree))

    def sweeps(self) -> list[tuple[float, str | None]]:
        """(temperature, coupling) of every sweep, in order; None at temperature 0."""
        return [(t, c) for t in self.temperatures for c in (self.couplings if t > 0 else (None,))]


def shape_label(entry: dict) -> str:
    """k, and the tree's width and nodes where the round drafted a tree: `k=4 w=2 n=8`."""
    width = entry.get("tree_width", 1)
    return f"k={entry['k']}" + (f" w={width} n={entry['tree_nodes']}" if width > 1 else "")


def tree_shapes(widths: tuple[int, ...], nodes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Every (width, nodes) of the two lists, in order; width 1 is the chain, whatever the nodes."""
    shapes = [(1, 0) if width == 1 else (width, n) for width in widths for n in nodes]
    return tuple(dict.fromkeys(shapes))


def fits(k: int, tree: tuple[int, int] | None) -> bool:
    """Whether the shape fits depth k (None, the profile's own, is checked by the profile)."""
    if tree is None or tree[0] == 1 or tree[1] == 0:
        return True
    return k <= tree[1] <= tree_envelope(k, tree[0])
