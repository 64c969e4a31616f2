from __future__ import annotations

import pytest

from hypic_rag import Segment
from hypic_rag.segments import KINDS, as_query


def test_segment_holds_text_or_ids():
    assert Segment("doc").text == "doc" and Segment("doc").kind == "document"
    seg = Segment(token_ids=[1, 2, 3], kind="tool")
    assert seg.token_ids == (1, 2, 3) and seg.kind == "tool"
    assert Segment(token_ids=[1, 2]) == Segment(token_ids=(1, 2))


@pytest.mark.parametrize(
    "args,kwargs,message",
    [
        ((), {}, "exactly one of text and token_ids"),
        (("a",), {"token_ids": [1]}, "exactly one of text and token_ids"),
        (("a",), {"kind": "image"}, "unknown segment kind 'image'"),
        ((), {"token_ids": [1, "2"]}, "list of ints"),
        ((), {"token_ids": "12"}, "list of ints"),
        ((3,), {}, "text must be a str"),
    ],
)
def test_bad_segments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Segment(*args, **kwargs)


def test_kinds_and_query():
    assert set(KINDS) == {"system", "document", "tool", "memory", "turn", "query"}
    assert as_query("q") == Segment("q", kind="query")
