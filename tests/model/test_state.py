"""A forward that records its linear layers' states at marks: every family's mixers record there the state
that forwards cut at the marks would end in, and the forward's outputs and end state do not change."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.model import load_model
from hypic_rag.model.state import StateMarks
from hypic_rag.testing.synthetic import KINDS, OWN_KINDS


def _linear(state) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    return {i: (s.conv, s.recurrent) for i in state.linear_layer_ids if (s := state.linear(i)) is not None}


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for i in a:
        for x, y in zip(a[i], b[i], strict=True):
            torch.testing.assert_close(x.float(), y.float(), rtol=1e-3, atol=1e-4, msg=f"layer {i}")


@pytest.mark.parametrize("kind", [*KINDS, *OWN_KINDS])
def test_marks_record_the_states_that_cut_forwards_end_in(checkpoint, kind):
    model = load_model(checkpoint(kind), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=gen)
    marked, cut = model.new_state(), model.new_state()
    for state in (marked, cut):
        model(ids[:, :10], state=state)  # marks after a state that is not zero
    marks = StateMarks((7, 19))
    logits = model(ids[:, 10:], state=marked, marks=marks)
    recorded = marks.linear(marked.linear_layer_ids)
    expected = []
    for lo, hi in ((10, 17), (17, 29)):
        model(ids[:, lo:hi], state=cut)
        expected.append(_linear(cut))
    last = model(ids[:, 29:], state=cut)
    for got, want in zip(recorded, expected, strict=True):
        _close({i: (s.conv, s.recurrent) for i, s in got.items()}, want)
    _close(_linear(marked), _linear(cut))
    torch.testing.assert_close(logits[:, 19:], last, rtol=1e-4, atol=1e-4)
    assert marked.seq_len == cut.seq_len == 40


def test_marks_must_lie_inside_the_forward():
    for at in ((0, 3), (3, 8), (5, 3), (3, 3)):
        with pytest.raises(ValueError, match="ascending positions inside a forward of 8 tokens"):
            StateMarks(at).pieces(8)
    assert StateMarks((2, 5)).pieces(8) == [(0, 2), (2, 5), (5, 8)]


def test_a_layer_that_recorded_nothing_is_found():
    marks = StateMarks((2,))
    marks.conv[0] = [torch.zeros(1, 2, 3)]
    with pytest.raises(ValueError, match="linear layer 0 recorded no state"):
        marks.linear([0])
