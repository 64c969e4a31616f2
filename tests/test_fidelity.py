from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.fidelity import answer_log_likelihood, kl_divergence, top1_agreement


def test_kl_and_top1_from_their_definitions():
    a = torch.tensor([2.0, 1.0, 0.0])
    b = torch.tensor([0.0, 1.0, 2.0])
    p, q = torch.softmax(a.double(), 0), torch.softmax(b.double(), 0)
    assert kl_divergence(a, a) == 0.0
    assert kl_divergence(a, b) == pytest.approx(float((p * (p / q).log()).sum()))
    assert top1_agreement(a, a + 5) and not top1_agreement(a, b)


def test_answer_log_likelihood_is_teacher_forced(checkpoint):
    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"))
    segs = [Segment(token_ids=list(range(10, 40))), Segment(token_ids=list(range(60, 75)))]
    query, answer = Segment(token_ids=[5, 6], kind="query"), [7, 8, 9, 11]
    ids = torch.tensor([list(range(10, 40)) + list(range(60, 75)) + [5, 6] + answer])
    with torch.inference_mode():
        logp = torch.log_softmax(engine.model(ids)[0].double(), dim=-1)
    start = ids.shape[1] - len(answer) - 1
    expected = sum(float(logp[start + j, a]) for j, a in enumerate(answer))
    assert answer_log_likelihood(engine, segs, query, answer, mode="full") == pytest.approx(expected, abs=1e-4)
    assert answer_log_likelihood(engine, segs, query, answer, mode="prefix") == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="at least one token"):
        answer_log_likelihood(engine, segs, query, [], mode="full")
