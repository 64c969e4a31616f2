from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.decoding import REDECODED, Decoder, step_together
from hypic_rag.logits import Sampler


def test_greedy_is_argmax():
    assert Sampler().pick(torch.tensor([0.1, 3.0, 2.0]), None) == 1


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    sampler = Sampler(temperature=1.0, top_p=0.8, seed=0)
    gen = sampler.generator(torch.device("cpu"))
    picks = {sampler.pick(logits, gen) for _ in range(300)}
    assert picks == {0, 1}  # 0.5 + 0.3 reaches 0.8; the tail is cut


def _draws(sampler: Sampler, logits: torch.Tensor, n: int) -> list[int]:
    gen = sampler.generator(torch.device("cpu"))
    return [sampler.pick(logits, gen) for _ in range(n)]


def test_top_k_one_is_the_argmax():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert set(_draws(Sampler(temperature=5.0, top_k=1, seed=3), logits, 200)) == {int(torch.argmax(logits))}


def test_top_k_keeps_only_the_k_highest():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    top3 = set(torch.topk(logits, 3).indices.tolist())
    picks = set(_draws(Sampler(temperature=10.0, top_k=3, seed=0), logits, 500))
    assert picks == top3  # a hot temperature reaches all three and nothing else
    assert len(set(_draws(Sampler(temperature=10.0, seed=0), logits, 500))) > 3  # without top_k it would


def test_top_k_keeps_ties_and_off_values():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.0])
    assert set(_draws(Sampler(temperature=1.0, top_k=2, seed=0), logits, 300)) == {0, 1, 2}  # both at the 2nd value
    for off in (None, 0, 10):
        assert set(_draws(Sampler(temperature=1.0, top_k=off, seed=0), logits, 400)) == {0, 1, 2, 3}


def test_top_k_applies_before_top_p():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    # After top_k=2 the kept mass renormalises to 4/7 and 3/7, so top_p=0.5 keeps the first token only.
    assert set(_draws(Sampler(temperature=1.0, top_k=2, top_p=0.5, seed=0), logits, 200)) == {0}


def test_top_k_validation():
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="top_k"):
            Sampler(temperature=1.0, top_k=bad)


def test_engine_generate_passes_top_k(checkpoint):
    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"))
    engine.eos_token_ids = ()
    query = Segment(token_ids=list(range(3, 40)))
    greedy = engine.generate([], query, mode="full", max_new_tokens=8).token_ids
    top1 = engine.generate([], query, mode="full", max_new_tokens=8, temperature=2.0, top_k=1, seed=5).token_ids
    assert top1 == greedy
    with pytest.raises(ValueError, match="top_k"):
        engine.generate([], query, mode="full", temperature=1.0, top_k=-2)


class _SearchLog(str):
    """A text that records where each search for a stop string starts."""

    starts: list[tuple[int, int]] = []

    def find(self, sub, start=0, *args):
        _SearchLog.starts.append((len(self), start))
        return str.find(self, sub, start, *args)


def test_stop_strings_are_searched_for_only_near_the_end_of_the_answer(checkpoint):
    """Each token's search starts at most the longest stop string (and a few re-decoded characters) before the
    text's previous end, so matching stays linear in the answer, and a stop string is still found where it ends."""
    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"))
    words = [f" w{i}" for i in range(60)]
    stops = ["w58 w5", "never in it"]
    model = engine.model
    state = model.new_state()
    with torch.inference_mode():
        model(torch.tensor([[3, 4, 5]]), state=state)
    _SearchLog.starts = []
    decoder = Decoder(
        model,
        state,
        0,
        Sampler(),
        None,
        stops=(),
        max_new_tokens=200,
        detokenize=lambda ids: _SearchLog("".join(words[i % 60] for i in range(len(ids)))),
        stop_strings=stops,
    )
    decoder.picker.pick = lambda logits, **kwargs: 0  # the text is the fake detokenizer's, whatever is picked
    while not step_together([decoder])[0]:
        pass
    assert decoder.finish == "stop" and decoder.text == "".join(words[:58]) + " "
    reach = max(map(len, stops)) + REDECODED
    lengths = sorted({length for length, _ in _SearchLog.starts})
    before = dict(zip(lengths[1:], lengths, strict=False))  # each token's text length -> the token before's
    for length, start in _SearchLog.starts:
        assert start >= before.get(length, 0) - reach
    assert max(start for _, start in _SearchLog.starts) > 200  # it moved along: not the whole text each time
