"""What the integrations share: the engines they load, call parsing, the registry of retrieved texts, streaming."""

from __future__ import annotations

import pytest

from hypic_rag import GenerationOutput
from hypic_rag.integrations.prompting import (
    TextRegistry,
    default_engine,
    load_engine,
    stream_tokens,
    uses_bundled_format,
)


def test_registry_finds_texts_in_order_and_keeps_the_rest():
    reg = TextRegistry(capacity=2)
    reg.register(["Alpha lives in Oslo.", "Beta is 40 years old.", "Gamma works at Acme."])
    assert len(reg) == 2  # the oldest was dropped
    flat = "Context:\nGamma works at Acme.\n\nBeta is 40 years old.\n\nQuestion: How old is Beta?"
    docs, rest = reg.split(flat)
    assert docs == ["Gamma works at Acme.", "Beta is 40 years old."]
    assert rest == "Context: Question: How old is Beta?"
    assert reg.split("nothing here") == ([], "nothing here")


def test_registry_spans_and_parts_keep_the_text_as_written():
    reg = TextRegistry()
    reg.register(["Alpha lives in Oslo.", "Beta is 40 years old."])
    flat = "Context:\nBeta is 40 years old.\n\nAlpha lives in Oslo.\n\nQuestion: who?"
    runs = reg.spans(flat)
    assert "".join(run for _, run in runs) == flat
    assert [run for found, run in runs if found] == ["Beta is 40 years old.", "Alpha lives in Oslo."]
    assert reg.parts("Alpha lives in Oslo.") == [
        {"type": "text", "text": "Alpha lives in Oslo.", "hypic": {"kind": "document"}}
    ]
    assert reg.parts("none") == [{"type": "text", "text": "none"}]
    assert reg.spans("") == []


def test_engines_are_loaded_once_and_the_bundled_one_is_default(engine):
    assert load_engine() is load_engine("hypic-default") is default_engine()
    assert uses_bundled_format(default_engine()) and uses_bundled_format(engine)


def test_stream_tokens_yields_deltas_then_the_output_and_reraises():
    out = GenerationOutput("ab", [1, 2], 0.0)

    def run(cb):
        cb(1, "a")
        cb(2, "b")
        return out

    assert list(stream_tokens(run)) == ["a", "b", out]

    def fail(cb):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        list(stream_tokens(fail))
