"""The round's two ops tables agree: gpu/round_ops.py's TritonRoundOps against core/round/ops.py's
TorchRoundOps (the references), op by op on one round's inputs, and as whole rounds of each
coupling (every op of the table runs). Ids, counts and positions equal; probabilities to rounding
(as tests/gpu/kernels/test_warp_kernel.py). On CPU (CI) the kernels run in the Triton interpreter
(tests/triton_cpu.py); on a GPU the same tests run the compiled kernels, with and without
dependent launch.
"""

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import pytest
import torch

from round_helpers import StubRunner
from specgen.core.sampling import warp as sampling
from specgen.core.backend import RoundClock, TorchBackend
from specgen.core.sampling.bookkeeping import CommitBuffers
from specgen.core.round import Mode, Round, RoundShape
from specgen.core.round.ops import TorchRoundOps
from specgen.core.settings import SamplingSpec
from specgen.gpu.round_ops import TritonRoundOps
from specgen.gpu.workspace import Workspace

DEPENDENT = [False, True] if DEVICE.type == "cuda" else [False]
K, WIDTH, VOCAB = 3, 100, 90  # columns past VOCAB are padding (masked)


def _close(got, want, what: str) -> None:
    if want is None:
        assert got is None, what
        return
    assert torch.equal(got > 0, want > 0), f"{what}: kept sets differ"
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-8, msg=what)


def _inputs(seed: int) -> dict:
    """What the ops of one sampled round with penalties and a padding mask read."""
    gen = torch.Generator().manual_seed(seed)
    spec = SamplingSpec(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2, presence_penalty=0.3)
    counts = torch.randint(0, 3, (K + 1, WIDTH), generator=gen, dtype=torch.int32)
    bad = torch.arange(WIDTH) >= VOCAB
    probs_q = torch.softmax(torch.randn(K, WIDTH, generator=gen) * 2, dim=-1)
    drafts = torch.multinomial(probs_q, 1, generator=gen)[:, 0]
    on = dict(
        logits=torch.randn(K + 1, WIDTH, generator=gen) * 3, bad=bad.expand(K + 1, WIDTH).contiguous(),
        counts=counts, seen=counts > 0, expo=sampling.exponentials((K + 1, WIDTH), gen, "cpu"),
        uniforms=sampling.uniforms((K,), gen, "cpu"), q=probs_q, drafts=drafts,
        cu=torch.tensor([K - 1], dtype=torch.int32), key=torch.tensor([seed, 7]), first=torch.tensor(30 + seed))
    x = {name: tensor.to(DEVICE) for name, tensor in on.items()}
    x["penalties"] = sampling.PenaltyRows(x.pop("counts"), x.pop("seen"))
    x["params"] = sampling.WarpParams.from_spec(spec, K + 1, DEVICE)
    return x


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("seed", [0, 1])
def test_each_op_agrees_with_the_reference_on_one_rounds_inputs(seed, dependent):
    x, ref, ker = _inputs(seed), TorchRoundOps(), TritonRoundOps(Workspace(DEVICE), dependent)
    rows = (x["logits"], x["params"], x["penalties"], x["bad"])
    (want_argmax, want_probs), (argmax, probs) = ref.warp(*rows), ker.warp(*rows)
    assert torch.equal(argmax, want_argmax)
    _close(probs, want_probs, "warp")
    outs = [torch.zeros(K + 1, dtype=torch.long, device=DEVICE) for _ in range(2)]
    ref.argmax(x["logits"], outs[0])
    ker.argmax(x["logits"], outs[1])
    assert torch.equal(outs[0], outs[1])
    into = [torch.full((K + 1, WIDTH), -1.0, device=DEVICE) for _ in range(2)]
    raced = [ops.warp_and_race(x["logits"], x["params"], x["expo"], out, x["penalties"], x["bad"], probs_out=buffer)
             for ops, out, buffer in zip((ref, ker), outs, into)]
    assert torch.equal(outs[0], outs[1]) and raced[1] is into[1]
    _close(raced[1], raced[0], "warp_and_race")
    noise = [torch.zeros(K + 1, WIDTH, device=DEVICE) for _ in range(2)]
    for ops, out in zip((ref, ker), noise):
        ops.gumbel_noise(out, x["key"], x["first"])
    assert torch.equal(noise[0], noise[1])
    common = (x["drafts"], x["cu"])
    assert torch.equal(ref.verify_greedy(*common, want_argmax, K), ker.verify_greedy(*common, want_argmax, K))
    for q in (x["q"], None):  # sampled drafts; one-hot q (host drafts)
        verified = [ops.verify_random(*common, q, want_probs, x["uniforms"], x["expo"][-1:], K) for ops in (ref, ker)]
        assert torch.equal(*verified)
    confident = torch.tensor([True, True, False], device=DEVICE)
    counted = [torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(2)]
    for ops, out in zip((ref, ker), counted):
        ops.count_drafts(confident, torch.tensor([K], dtype=torch.int32, device=DEVICE), torch.tensor(1 << 62,
                         device=DEVICE), torch.tensor(5, device=DEVICE), out)
    assert torch.equal(*counted) and int(counted[0]) == 2
    commits = [_commit_buffers(verified[0][0]) for _ in range(2)]
    ref.commit(commits[0])
    ker.commit(commits[1])
    for name in ("row", "feed", "stage", "target_position", "emitted", "generated", "draft_position", "pending"):
        assert torch.equal(getattr(commits[0], name), getattr(commits[1], name)), name


def _commit_buffers(row: torch.Tensor) -> CommitBuffers:
    long = dict(dtype=torch.long, device=DEVICE)
    return CommitBuffers(row=row.clone(), feed=torch.tensor([8, 11, 12, 13], **long),
                         num_drafts=torch.tensor([K - 1], dtype=torch.int32, device=DEVICE),
                         stage=torch.zeros(2 * K + 2, **long), target_position=torch.tensor(40, **long),
                         emitted=torch.tensor(1, **long), generated=torch.tensor(9, **long),
                         draft_position=torch.tensor(39, **long), pending=torch.tensor([7, 8], **long), ran=K + 1)


# ---------------------------------------------------------------- whole rounds on each table


def _stub(table: torch.Tensor) -> StubRunner:
    runner = StubRunner(WIDTH, 0)
    runner.table, runner.position, runner.device = table.to(DEVICE), runner.position.to(DEVICE), DEVICE
    return runner


def _round(spec: SamplingSpec, ops, **shape) -> Round:
    """A round over a stub target and a draft that mostly agrees with it (some drafts accepted, some not)."""
    backend = TorchBackend(DEVICE)
    backend.ops = ops
    target = StubRunner(WIDTH, 1).table
    draft = target + torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(2)) * 2
    fields = dict(k=K, width=WIDTH, vocab_size=VOCAB, drafter="draft",
                  draft_pick="argmax" if spec.greedy else "sample", rows=("penalties", "min_tokens")) | shape
    return Round(RoundShape(**fields), spec, backend, _stub(target), _stub(draft), [3, 7])


def _state(rnd: Round) -> list[torch.Tensor]:
    return [rnd.out, rnd.feed, rnd.num_drafts, rnd.stage_ids, rnd.generated, rnd.emitted, rnd.target.position,
            rnd.draft.position, *rnd.drafter.state()]


@pytest.mark.parametrize(("spec", "shape"), [
    (SamplingSpec(), dict(rows=())),  # the draft's argmax
    (SamplingSpec(min_tokens=4), dict()),
    (SamplingSpec(temperature=0.9, top_p=0.95, repetition_penalty=1.3, min_tokens=4), dict()),
    (SamplingSpec(temperature=0.9, top_k=30, presence_penalty=0.4), dict(coupling="gumbel")),
], ids=["greedy", "greedy-rows", "rejection", "gumbel"])
def test_rounds_on_the_triton_table_equal_rounds_on_the_references(spec, shape):
    rounds = [_round(spec, ops, **shape) for ops in (TorchRoundOps(), TritonRoundOps(Workspace(DEVICE)))]
    gens = [torch.Generator(DEVICE).manual_seed(3) for _ in rounds]  # the round draws on its own device
    clock = RoundClock(DEVICE)
    for rnd in rounds:
        rnd.start([5, 6, 9, 9, 2], seed=11)
    emitted = []
    for i in range(6):
        for rnd, gen in zip(rounds, gens):
            rnd.set_budget(K)
            rnd.draw(gen)
            rnd.backend.program(rnd, Mode.MODEL).launch(clock)
        for want, got in zip(_state(rounds[0]), _state(rounds[1])):
            assert torch.equal(want, got), f"round {i}: {want.tolist()} != {got.tolist()}"
        if rounds[0].floats:
            torch.testing.assert_close(rounds[1].stage_f, rounds[0].stage_f, rtol=2e-5, atol=1e-7)
        emitted.append(int(rounds[0].emitted))
    assert min(emitted) == 1 and max(emitted) > 1, emitted  # some rounds keep drafts, some keep none


@pytest.mark.parametrize("dependent", DEPENDENT)
@pytest.mark.parametrize("spec", [SamplingSpec(), SamplingSpec(temperature=0.8, top_p=0.9, top_k=40),
                                  SamplingSpec(temperature=1.0, min_p=0.05)], ids=["greedy", "top-p", "min-p"])
def test_a_tree_levels_log_q_agrees_with_the_reference(spec, dependent):
    """tree_logq: greedy levels through the chunked log_softmax, sampled ones through the warp
    kernels' q; values to rounding, -inf (cut or padding ids) in the same places, the same children."""
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(4, WIDTH, generator=gen) * 3).to(DEVICE)
    bad = (torch.arange(WIDTH) >= VOCAB).to(DEVICE)
    params = sampling.WarpParams.from_spec(spec, 4, DEVICE)
    want = TorchRoundOps().tree_logq(logits, params, bad)
    got = TritonRoundOps(Workspace(DEVICE), dependent).tree_logq(logits, params, bad)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and bool(torch.isinf(got[:, VOCAB:]).all())
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=2e-5)
    assert torch.equal(TorchRoundOps().tree_children(got, None, 3)[0], TorchRoundOps().tree_children(want, None, 3)[0])


def test_the_tree_walks_of_each_table_agree():
    """greedy_walk, sibling_walk and recursive_walk on both tables (the kernels' own exactness
    tests are tests/gpu/kernels/test_tree_walk_kernel.py's): a full binary tree of depth 2, three
    trees, each child's token its parent's likeliest ids."""
    gen = torch.Generator().manual_seed(4)
    k, w, batch = 2, 2, 3
    children = torch.tensor([[1, 2], [3, 4], [5, 6]] + [[-1, -1]] * 4).expand(batch, -1, -1)
    probs = torch.softmax(torch.randn(batch, 7, WIDTH, generator=gen) * 3, dim=-1)
    q = torch.softmax(torch.randn(batch, 7, WIDTH, generator=gen) * 3, dim=-1)
    drawn = probs.topk(w, dim=-1).indices  # [B, R, w]
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), drawn[:, :3].reshape(batch, 6)], dim=1)
    x = [t.to(DEVICE) for t in (children, tokens, probs, q, drawn, probs.argmax(-1),
                                sampling.uniforms((batch, k, w), gen, "cpu"), sampling.exponentials((batch, WIDTH), gen, "cpu"))]
    children, tokens, probs, q, drawn, choice, uniforms, expo = x
    limit = torch.tensor([k], dtype=torch.int32, device=DEVICE)
    ref, ker = TorchRoundOps(), TritonRoundOps(Workspace(DEVICE))
    calls = [lambda ops: ops.greedy_walk(children, tokens, choice, limit, k),
             lambda ops: ops.sibling_walk(children, tokens, probs, uniforms, expo, limit, k),
             lambda ops: ops.recursive_walk(children, drawn, tokens, probs, q, uniforms, expo, limit, k),
             lambda ops: ops.recursive_walk(children, drawn, tokens, probs, q, uniforms, expo, limit, k,
                                            point=(torch.arange(w, device=DEVICE) == 0).expand_as(drawn))]
    for call in calls:
        for want, got in zip(call(ref), call(ker)):
            assert torch.equal(want, got)
