"""core/round/drafters.py, draft_model.py, head.py and stage.py: the drafters one at a time on a
stub runner, the draft pick against the references, and the float stages."""

from __future__ import annotations

import torch

from round_helpers import StubRunner, shared
from specgen.core.sampling import warp as sampling
from specgen.core.round.couplings import RejectionCoupling
from specgen.core.round.draft_model import DraftModel
from specgen.core.round.drafters import DraftPick, HostLookup, NoDraft
from specgen.core.round.head import HeadDrafts
from specgen.core.round.rows import LogitsRows, MinTokens, NoPenalties, Padding
from specgen.core.round.stage import DraftProbs, Insight, NoStage
from specgen.core.sampling.warp import WarpParams
from specgen.core.settings import SamplingSpec


def pick_for(rnd, spec: SamplingSpec, races: bool = False, p_min: float = 0.0, keep_q: bool = False, mask=None):
    params = WarpParams.from_spec(spec, 1)
    rows = LogitsRows(WarpParams.from_spec(spec, rnd.k + 1), params, NoPenalties(),
                      mask or Padding(rnd.width, rnd.width, rnd.device))
    coupling = RejectionCoupling(rnd, sampled=not spec.greedy, draft_races=races)
    return DraftPick(rnd, rows, coupling, p_min, keep_q), coupling


def test_draft_pick_argmax_warp_and_race():
    rnd, logits = shared(3, 16), torch.randn(1, 16, generator=torch.Generator().manual_seed(2))
    plain, _ = pick_for(rnd, SamplingSpec())
    assert plain.plain
    plain(0, logits)
    assert int(rnd.drafts[0]) == int(logits.argmax())
    masked, _ = pick_for(rnd, SamplingSpec(min_tokens=5), mask=MinTokens(16, 16, [int(logits.argmax())], 5,
                                                                        rnd.generated, rnd.steps))
    assert not masked.plain
    masked(1, logits)
    assert int(rnd.drafts[1]) == int(logits[0].topk(2).indices[1])  # the stop id is masked
    spec = SamplingSpec(temperature=0.7)
    racing, coupling = pick_for(rnd, spec, races=True)
    coupling.draw(torch.Generator().manual_seed(4))
    racing(2, logits)
    _, probs = sampling.warp(logits, WarpParams.from_spec(spec, 1))
    assert torch.equal(coupling.q[2:3], probs)
    assert int(rnd.drafts[2]) == int(sampling.sample_race(probs, coupling.noise[2:3])[0])


def test_p_min_cuts_the_drafts_that_count():
    rnd = shared(3, 16)
    pick, _ = pick_for(rnd, SamplingSpec(), p_min=0.5)
    sure, unsure = torch.full((1, 16), -9.0), torch.zeros(1, 16)
    sure[0, 3] = 9.0
    for i, logits in enumerate((sure, sure, unsure)):
        pick(i, logits)
    assert rnd.drafts.tolist()[:2] == [3, 3] and pick.confident.tolist() == [True, True, False]
    assert abs(float(pick.q_token[0]) - float(torch.softmax(sure, -1)[0, 3])) < 1e-6
    rnd.budget.fill_(3)
    pick.count()
    assert int(rnd.num_drafts) == 2
    rnd.limit.fill_(1)  # max_tokens 2: one draft, then the target's token
    pick.count()
    assert int(rnd.num_drafts) == 1


def test_draft_model_steps_over_pending_then_its_picks():
    rnd = shared(3, 16)
    draft = StubRunner(16, 5)
    model = DraftModel(rnd, draft, pick_for(rnd, SamplingSpec())[0])
    model.prefill([1, 2, 3, 4])
    assert model.pending[0].tolist() == [3, 4] and int(draft.position) == 2 and int(rnd.target.position) == 3
    rnd.budget.fill_(3)
    model.draft()
    first = int(draft.table[4].argmax())
    assert rnd.drafts.tolist() == [first, int(draft.table[first].argmax()), int(draft.table[rnd.drafts[1]].argmax())]
    assert int(rnd.num_drafts) == 3 and int(draft.position) == 2 + 2 + 2
    rnd.feed[0, 0].fill_(9)
    model.follow()
    assert model.follow_ids.tolist() == [3, 9, *rnd.drafts.tolist()]
    fields = model.commit_fields()
    assert fields["ran"] == 4 and fields["pending"].data_ptr() == model.pending.data_ptr()


def test_host_lookup_writes_drafts_and_the_follower_follows():
    rnd = shared(3, 16)
    draft = StubRunner(16, 5)
    model = DraftModel(rnd, draft, pick_for(rnd, SamplingSpec())[0])
    host = HostLookup(rnd, model)
    model.prefill([1, 2, 3])
    host.set_drafts([7, 8])
    host.draft()
    assert rnd.drafts.tolist()[:2] == [7, 8] and int(rnd.num_drafts) == 2
    assert int(draft.position) == 1 + 5  # one step over [committed[-2], last, 3 drafts]
    assert host.one_hot and host.runners == [draft] and host.commit_fields()["ran"] == 5
    alone = HostLookup(rnd, NoDraft(rnd))
    alone.set_drafts([])
    alone.draft()
    assert int(rnd.num_drafts) == 0 and alone.commit_fields() == {"ran": 5} and alone.runners == []


class StubHead:
    """A head whose logits are a table of the ids it is fed (extend: of the last emitted row)."""

    def __init__(self, width: int):
        self.table = StubRunner(width, 8).table
        self.calls: list[tuple] = []
        self.tap = type("Tap", (), {"out": torch.zeros(4, 2)})()

    def features(self, rows: int) -> torch.Tensor:
        return torch.zeros(rows, 2)

    def extend(self, ids, features, positions):
        self.calls.append(("extend", ids.tolist(), positions.tolist()))
        return self.table[ids], torch.zeros(ids.shape[0], 2)

    def step(self, ids, hidden, positions):
        self.calls.append(("step", ids.tolist(), positions.tolist()))
        return self.table[ids], hidden


def test_head_extends_over_the_emitted_rows_then_steps():
    rnd, head = shared(3, 16), StubHead(16)
    drafts = HeadDrafts(rnd, head, pick_for(rnd, SamplingSpec())[0])
    rnd.target.position.fill_(10)
    rnd.out[0].copy_(torch.tensor([5, 6, -1, -1]))
    rnd.emitted.fill_(2)
    rnd.budget.fill_(3)
    drafts.draft()
    assert head.calls[0] == ("extend", [5, 6, 0, 0], [8, 9, 10, 11])
    assert int(rnd.drafts[0]) == int(head.table[6].argmax())  # row e - 1 predicts the first draft
    assert [call[2] for call in head.calls[1:]] == [[10], [11]]
    drafts.follow()
    assert head.calls[-1][0] == "extend" and len(head.calls) == 4
    assert drafts.commit_fields() == {"ran": 4} and not drafts.one_hot


def test_stages_stage_and_read_what_the_host_needs():
    k, width = 2, 8
    rnd = shared(k, width)
    rnd.drafts.copy_(torch.tensor([3, 5]))
    probs = torch.softmax(torch.randn(k + 1, width), dim=-1)
    q = torch.softmax(torch.randn(k, width), dim=-1)
    stage = DraftProbs(rnd, torch.zeros(k), has_q=True)
    stage.stage(probs, q, (), one_hot=False)
    p_d, q_d = probs[[0, 1], [3, 5]], q[[0, 1], [3, 5]]
    assert torch.equal(stage.out, torch.cat([p_d, q_d]))
    p, q_read, entropy = stage.read(stage.out.tolist(), one_hot=True)
    assert q_read is None and entropy is None and p == stage.out.tolist()[:k]
    stage.stage(probs, None, (), one_hot=True)
    assert stage.out.tolist()[k:] == [1.0, 1.0]  # host drafts: q one-hot
    insight = Insight(rnd, torch.tensor([0.25, 0.5]))
    rows = (WarpParams.from_spec(SamplingSpec(), k + 1), None, None)
    rnd.target_logits.copy_(torch.randn(k + 1, width))
    insight.stage(None, None, rows, one_hot=False)  # greedy: p from the target's rows
    p_all = torch.softmax(rnd.target_logits, dim=-1)
    p, q_read, entropy = insight.read(insight.out.tolist(), one_hot=False)
    assert torch.allclose(torch.tensor(p), p_all[[0, 1], [3, 5]]) and q_read == [0.25, 0.5]
    assert torch.allclose(torch.tensor(entropy), torch.special.entr(p_all[:k]).sum(-1))
    none = NoStage(rnd)
    assert not none.staged and none.read([0.0], one_hot=False) == (None, None, None)
