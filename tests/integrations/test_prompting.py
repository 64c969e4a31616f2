"""What the integrations share: the engines they load, the registry of retrieved texts, streaming, and the request
options as the frameworks' fields."""

from __future__ import annotations

import threading
import time

import pytest

from hypic_rag import GenerationOutput
from hypic_rag.chat.formats import BUNDLED
from hypic_rag.integrations.prompting import (
    FIELD_NAMES,
    TextRegistry,
    default_engine,
    load_engine,
    option_fields,
    request_options,
    stream_tokens,
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
    assert default_engine().chat_format is engine.chat_format is BUNDLED


def test_stream_tokens_yields_deltas_then_the_output_and_reraises():
    out = GenerationOutput("ab", [1, 2], 0.0)

    def run(cb, cancelled):
        cb(1, "a")
        cb(2, "b")
        return out

    assert list(stream_tokens(run)) == ["a", "b", out]

    def fail(cb, cancelled):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        list(stream_tokens(fail))


def test_a_stream_closed_by_its_reader_is_cancelled():
    seen: list[bool] = []
    ended = threading.Event()

    def run(cb, cancelled):
        cb(1, "a")
        deadline = time.monotonic() + 120  # a bound, not the property: it ends when the reader's close arrives
        while not cancelled() and time.monotonic() < deadline:  # a long answer, asked before each token
            time.sleep(0.001)
        seen.append(cancelled())
        ended.set()
        return GenerationOutput("a", [1], 0.0)

    stream = stream_tokens(run)
    assert next(stream) == "a"
    stream.close()  # the reader stops
    assert ended.wait(180) and seen == [True]


def test_the_frameworks_fields_are_the_request_options():
    from hypic_rag.integrations.langchain import ChatHypic
    from hypic_rag.integrations.llamaindex import HypicLLM
    from hypic_rag.options import OPTIONS, RequestOptions

    spelled = [FIELD_NAMES.get(name, name) for name in OPTIONS]
    assert option_fields(ChatHypic()) == spelled
    assert option_fields(HypicLLM()) == [n for n in spelled if n not in ("stop", "stop_token_ids")]
    assert ChatHypic.model_fields["max_tokens"].default is None and ChatHypic().mode == "hypic"
    llm = ChatHypic(max_tokens=3, seam=4, stop_sequences=["x"])  # LangChain's other name for stop
    assert request_options(llm, {"seed": 1}) == RequestOptions(max_new_tokens=3, seam=4, stop=("x",), seed=1)
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        ChatHypic(max_tokens=0)
    with pytest.raises(ValueError, match="top_p must be a number in"):
        request_options(llm, {"top_p": 2})
