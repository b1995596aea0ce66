"""inspect-acceptance exports: a self-contained HTML page and a PNG plot of the same report.

The page has inline CSS only (no scripts, fonts or links), so it opens anywhere, offline. A token
tree run's rounds each open on a click (<details>) to the round's tree as nested lists, the
accepted path highlighted (a hybrid run's: the lookup's nodes outlined, the model's plain).
The plot needs matplotlib, the optional extra `plot`.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from specgen.core.errors import SpecgenError

COLOURS = {"accepted": "#1a7f37", "recovered": "#b08800", "bonus": "#0969da"}  # render.FATE_STYLES in CSS

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; padding: 0 1rem; max-width: 60rem; color: #1f2328; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: .75rem; border-radius: 6px; }
.prompt { color: #6e7781; }
.accepted { color: #1a7f37; } .recovered { color: #b08800; background: #fff8c5; } .bonus { color: #0969da; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; }
th, td { padding: .2rem .6rem; text-align: right; border-bottom: 1px solid #d0d7de; }
th:first-child, td.left { text-align: left; }
.bar { background: #1a7f37; height: .8rem; }
.barcell { width: 12rem; }
code { background: #f6f8fa; padding: 0 .2rem; white-space: pre; }  /* a token's spaces are part of it */
details.round > summary { cursor: pointer; }
ul.tree { list-style: none; margin: .1rem 0; padding-left: 1.4rem; border-left: 1px dotted #d0d7de; }
.node { color: #6e7781; } .node.path code { color: #1a7f37; font-weight: bold; background: #dafbe1; }
.node.target code { color: #b08800; } .node small { color: #6e7781; }
"""
# only in a hybrid tree run's page (other pages stay as they were): the lookup's nodes
HYBRID_CSS = """.node.lookup code { outline: 1px solid #8250df; } .node.lookup small { color: #8250df; }
"""


def html_page(document: dict) -> str:
    source = document["source"]
    title = f"specgen inspect-acceptance · {source['profile']} · k={source['k']} · T={source['temperature']:g}"
    hybrid = (document.get("tree") or {}).get("hybrid")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{CSS}{HYBRID_CSS if hybrid else ''}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p>{_totals(document)}</p>",
        "<p>" + " ".join(f'<span class="{fate}">■ {fate}</span>' for fate in COLOURS) + "</p>",
    ]
    for i, run in enumerate(document["runs"]):
        parts.append(f"<h2>Prompt {i + 1}</h2>{_text(run, source.get('chat', False))}{_rounds(run)}")
    parts += [
        "<h2>Per-position acceptance</h2>",
        _table(("position", "drafted", "accepted", "rate", ""),
               [(r["position"], r["drafted"], r["accepted"], _pct(r["rate"]), _bar(r["rate"]))
                for r in document["per_position"]]),
    ]
    tree = document.get("tree")
    if tree:
        parts += [
            f"<h2>Token tree against its chain</h2><p>{tree['tokens_per_round']:.2f} tokens per round; the "
            f"chain inside the tree (each node's first child) would have yielded "
            f"{tree['chain_tokens_per_round']:.2f} ({tree['gain_per_round']:+.2f}). Per depth: the rounds whose "
            "accepted path reached it, those whose chain would have, and those won by another child.</p>",
            _table(("depth", "reached", "rate", "its chain reached", "chain rate", "branch wins", "of reached"),
                   [(d["depth"], d["reached"], _pct(d["rate"]), d["chain_reached"], _pct(d["chain_rate"]),
                     d["branch_wins"], _pct(d["branch_rate"])) for d in tree["per_depth"]]),
        ]
    if hybrid:
        parts += [
            f"<h2>Hybrid tree: whose nodes the accepted path took</h2><p>{hybrid['rounds']} rounds, "
            f"{hybrid['merged_rounds']} of them with the lookup's nodes in the tree "
            '(<span class="node lookup"><code>outlined</code></span> in the rounds\' trees); '
            f"{hybrid['none']} accepted none. A path is one part's nodes from the root down.</p>",
            _table(("path", "rounds", "rate", "tokens accepted", "share", "per round"),
                   [(f"the {part}'s", hybrid[part]["rounds"], _pct(hybrid[part]["rate"]), hybrid[part]["accepted"],
                     _pct(hybrid[part]["share"]), _p(hybrid[part]["tokens_per_round"]))
                    for part in ("lookup", "model")]),
            _table(("depth", "reached through the lookup's", "through the model's"),
                   [(d["depth"], d["lookup"], d["model"]) for d in hybrid["per_depth"]]),
        ]
    parts += [
        "<h2>Most rejected draft tokens</h2>",
        _table(("token", "count", "q(x) draft", "p(x) target", "target chose", "context"),
               [(_code(repr(e["text"])), e["count"], _p(e["mean_q"]), _p(e["mean_p"]),
                 _code(repr(e["examples"][0]["target_text"])), _code("…" + repr(e["examples"][0]["context"])[1:-1]))
                for e in document["rejected"]]),
    ]
    if document["entropy"]:
        parts += [
            "<h2>Acceptance by target entropy (verified positions)</h2>",
            _table(("entropy (nats)", "verified", "accepted", "rate", ""),
                   [(_range(b), b["verified"], b["accepted"], _pct(b["rate"]), _bar(b["rate"]))
                    for b in document["entropy"]]),
        ]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _totals(document: dict) -> str:
    t, f = document["totals"], document["fates"]
    return (f"{t['generated_tokens']} tokens = {f['accepted']} accepted + {f['recovered']} recovered + "
            f"{f['bonus']} bonus · {t['rounds']} rounds · acceptance {t['acceptance_rate']:.1%} · "
            f"mean accepted length {t['mean_accepted_length']:.2f}")


def _text(run: dict, chat: bool) -> str:
    """The prompt, then the generated tokens coloured by fate, each with a tooltip of what the
    report knows of it (p, q, the target's entropy)."""
    from specgen.core.insight import RunRecord, token_details

    spans, room = [], len(run["text"])
    details = token_details(RunRecord.from_dict(run))
    for piece, fate, known in zip(run["pieces"], run["fates"], details):
        piece, room = piece[:max(room, 0)], room - len(piece)
        spans.append(f'<span class="{fate}" title="{escape(_tooltip(fate, known))}">{escape(piece)}</span>')
    prompt = run["prompt"] + ("\n" if chat else "")  # a chat's reply starts a line; a completion goes on
    return f'<pre><span class="prompt">{escape(prompt)}</span>{"".join(spans)}</pre>'


def _rounds(run: dict) -> str:
    """A tree run's rounds, each a <details> that opens to its tree (records with insight), its
    summary the tokens, the chain's and the winning branch ('' for a chain's run)."""
    texts = run.get("token_text", {})
    items = []
    for i, r in enumerate(run["rounds"]):
        if r.get("branch") is None:  # a chain's round (records from before trees too)
            continue
        branch = r["branch"]
        chain = min(next((d for d, rank in enumerate(branch) if rank != 0), len(branch)) + 1, len(r["token_ids"]))
        won = "·".join(str(rank) for rank in branch) or "none"
        summary = (f"round {i + 1}: {len(r['token_ids'])} tokens, its chain {chain} · "
                   f"sibling per depth {won}")
        if r.get("source") is not None:  # a hybrid run's round
            summary += f" · path: {r['source']}"
        body = _tree(r, texts) if r.get("tree") else "<p>(no tree: run with insight to keep it)</p>"
        items.append(f'<details class="round"><summary>{escape(summary)}</summary>{body}</details>')
    return "<h3>Rounds (click one for its tree)</h3>" + "".join(items) if items else ""


def _tree(r: dict, texts: dict) -> str:
    """The round's tree as nested lists from the root: each node's token, sibling index, p and q
    (a hybrid round's lookup nodes, its rows 1 .. lookup_nodes, outlined and named);
    the accepted path (and a draw taken outside the tree) highlighted, the target's own token
    (recovered or bonus) under the node the walk stopped at."""
    tree = r["tree"]
    lookup = r.get("lookup_nodes") or 0  # a hybrid round's: the lookup's nodes are rows 1 .. lookup
    path = set(tree["path"])
    last = tree["path"][-1] if tree["path"] else 0
    kids: dict[int, list[int]] = {}
    for row, up in enumerate(tree["parents"]):
        if up >= 0:
            kids.setdefault(up, []).append(row)

    def text(token: int) -> str:
        return repr(texts.get(str(token), texts.get(token, str(token))))

    def node(row: int) -> str:
        mine = 1 <= row <= lookup
        label = (f'<span class="node{" path" if row in path or row == 0 else ""}{" lookup" if mine else ""}" '
                 f'data-row="{row}"><code>{escape(text(tree["tokens"][row]))}</code>')
        if row:
            label += (f" <small>#{tree['ranks'][row]} p={tree['p'][row]:.3f} q={tree['q'][row]:.3f}"
                      f"{' lookup' if mine else ''}</small>")
        label += "</span>"
        below = [node(child) for child in sorted(kids.get(row, []), key=lambda c: tree["ranks"][c])]
        if row == last:
            below += _ends(r, tree, text)
        return f"<li>{label}" + (f'<ul class="tree">{"".join(below)}</ul>' if below else "") + "</li>"

    return f'<ul class="tree">{node(0)}</ul>'


def _ends(r: dict, tree: dict, text) -> list[str]:
    """Where the walk ended, under its last accepted node: a draw it took outside the tree, or the
    target's token (recovered or bonus) after the accepted path."""
    taken = tree.get("taken")
    if taken:
        token, p, q, rank = taken
        return [f'<li><span class="node path"><code>{escape(text(token))}</code> <small>#{rank} p={p:.3f} '
                f"q={q:.3f} (drawn outside the tree)</small></span></li>"]
    if len(r["token_ids"]) > r["num_accepted"]:
        fate = "bonus" if r["num_accepted"] == len(r["drafted_ids"]) else "recovered"
        return [f'<li><span class="node target"><code>{escape(text(r["token_ids"][-1]))}</code> '
                f"<small>the target's ({fate})</small></span></li>"]
    return []


def _tooltip(fate: str, known: dict) -> str:
    lines = [fate]
    if "rejected" in known:
        lines.append(f"drafted {known['rejected']!r}, rejected:")
    if "p" in known:
        lines.append(f"p(x) target {known['p']:.3f} · q(x) draft {_p(known['q'])}")
    if "entropy" in known:
        lines.append(f"target entropy {known['entropy']:.2f} nats")
    return "\n".join(lines)


def _table(header: tuple, rows: list[tuple]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Html(str):
    """Markup built here, inserted as it is."""


def _cell(value) -> str:
    if isinstance(value, _Html):
        return f'<td class="left">{value}</td>'
    return f"<td>{escape(str(value))}</td>"


def _code(text: str) -> _Html:
    return _Html(f"<code>{escape(text)}</code>")


def _bar(rate: float | None) -> _Html:
    width = 0 if rate is None else round(100 * rate, 1)
    return _Html(f'<div class="barcell"><div class="bar" style="width: {width}%"></div></div>')


def _pct(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.1%}"


def _p(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _range(b: dict) -> str:
    return f"[{b['lower']:g}, {'∞' if b['upper'] is None else format(b['upper'], 'g')})"


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise SpecgenError("PNG export needs matplotlib, which is not installed: pip install 'specgen[plot]'") from None
    return matplotlib


def png_plot(document: dict, path: Path) -> None:
    from matplotlib import pyplot as plt

    fig = png_figure(document)
    try:
        fig.savefig(path, dpi=120, format="png")  # the path may end in .tmp
    finally:
        plt.close(fig)


def png_figure(document: dict):
    require_matplotlib().use("Agg")  # no display needed
    from matplotlib import pyplot as plt

    panels = 3 if document["entropy"] else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), constrained_layout=True)
    rows = document["per_position"]
    axes[0].bar([r["position"] for r in rows], [r["rate"] for r in rows], color=COLOURS["accepted"])
    axes[0].set(title="per-position acceptance", xlabel="draft position", ylabel="P(accepted)", ylim=(0, 1))
    fates = document["fates"]
    axes[1].bar(list(fates), list(fates.values()), color=[COLOURS[f] for f in fates])
    axes[1].set(title=f"{document['totals']['generated_tokens']} tokens by fate", ylabel="tokens")
    if document["entropy"]:
        bins = document["entropy"]
        bars = axes[2].bar([_range(b) for b in bins], [b["rate"] or 0.0 for b in bins], color=COLOURS["accepted"])
        axes[2].bar_label(bars, labels=[f"n={b['verified']}" for b in bins], fontsize=8)
        # room above a full bar for its label, under the panel's title
        axes[2].set(title="acceptance by target entropy", xlabel="entropy (nats)", ylim=(0, 1.15),
                    yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
        axes[2].tick_params(axis="x", labelrotation=45)
    source = document["source"]
    fig.suptitle(f"{source['profile']} · k={source['k']} · T={source['temperature']:g}")
    return fig
