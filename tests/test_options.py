"""Request options (hypic_rag.options): each bad value is refused where it is given, naming the option as the
caller spelled it; defaults are filled in one place; the engine's keyword arguments are these options."""

from __future__ import annotations

import dataclasses

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.generation_config import GenerationDefaults
from hypic_rag.options import FALLBACK, OPTIONS, SPELLINGS, OptionError, RequestOptions

BAD = [
    ({"mode": "fast"}, "mode", "unknown mode 'fast'"),
    ({"seam": -1}, "seam", "seam must be"),
    ({"seam": 1.5}, "seam", "fractional seam"),
    ({"max_new_tokens": 0}, "max_new_tokens", "max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": 2.0}, "max_new_tokens", "max_new_tokens must be an integer"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1"),
    ({"temperature": -0.1}, "temperature", "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature", "temperature"),
    ({"top_p": 0}, "top_p", r"top_p must be a number in \(0, 1\]"),
    ({"top_k": -1}, "top_k", "top_k must be an integer >= 0"),
    ({"top_k": True}, "top_k", "top_k"),
    ({"seed": 2**64}, "seed", "64 bits"),
    ({"stop": "x"}, "stop", "stop must be a list of strings"),
    ({"stop": ["x" * 4000, "y" * 97]}, "stop", "4,096 characters in all, got 4,097"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids", "stop_token_ids must be a list of token ids"),
    ({"segmentation": "words"}, "segmentation", "segmentation must be one of explicit, auto, none"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs", "may not set tools"),
    ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs", "must be a dict"),
    ({"top_q": 0.5}, "top_q", "'top_q' is not a request option"),
    ({"max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens", "disagree"),
]


@pytest.mark.parametrize(("values", "option", "message"), BAD)
def test_each_bad_value_names_its_option(values, option, message):
    with pytest.raises(OptionError, match=message) as caught:
        RequestOptions.from_mapping(values)
    assert caught.value.option == option and isinstance(caught.value, ValueError)


def test_names_and_spellings():
    assert OPTIONS == tuple(f.name for f in dataclasses.fields(RequestOptions))
    assert all(option in OPTIONS for option in SPELLINGS.values())
    options = RequestOptions.from_mapping({"max_tokens": 5, "max_completion_tokens": 5, "stop": ["a"]})
    assert options.max_new_tokens == 5 and options.stop == ("a",)  # lists are kept as tuples: frozen
    assert RequestOptions.from_mapping({"temperature": None}, ignore_none=True) == RequestOptions()
    assert options.replace(max_tokens=7).max_new_tokens == 7 and options.max_new_tokens == 5
    assert RequestOptions.from_mapping({}, base=options) is options
    assert RequestOptions.from_mapping(options.as_dict()) == options


def test_defaults_are_the_request_s_then_the_checkpoint_s_then_the_fallback():
    checkpoint = GenerationDefaults(temperature=0.7, top_p=0.8, top_k=5, max_new_tokens=3, do_sample=True)
    filled = RequestOptions(temperature=0.0, top_k=0).with_defaults(checkpoint)
    assert (filled.max_new_tokens, filled.temperature, filled.top_p, filled.top_k) == (3, 0.0, 0.8, 0)
    fallback = RequestOptions().with_defaults(None)
    assert {k: getattr(fallback, k) for k in FALLBACK} == FALLBACK
    assert RequestOptions().with_defaults(GenerationDefaults(temperature=0.9, do_sample=False)).temperature == 0.0
    assert RequestOptions(mode="full", seam=4).with_defaults(checkpoint).seam == 4  # the rest is left alone


def test_the_engine_takes_the_options_as_keywords_or_whole(checkpoint):
    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"))
    engine.eos_token_ids = ()
    query = Segment(token_ids=list(range(3, 30)))
    options = RequestOptions(mode="full", max_new_tokens=4, temperature=1.5, seed=3)
    whole = engine.generate([], query, options).token_ids
    assert whole == engine.generate([], query, mode="full", max_new_tokens=4, temperature=1.5, seed=3).token_ids
    assert len(whole) == 4
    assert len(engine.generate([], query, options, max_new_tokens=2).token_ids) == 2  # keywords override
    with pytest.raises(ValueError, match="'top_q' is not a request option"):
        engine.generate([], query, top_q=0.5)
    with pytest.raises(ValueError, match="segmentation apply to chat requests"):
        engine.generate([], query, segmentation="none")
    with pytest.raises(ValueError, match="options must be a RequestOptions"):
        engine.generate([], query, {"mode": "full"})
    # the first stop id ends the answer, as an EOS would
    stopped = engine.generate([], query, options, stop_token_ids=[whole[1]])
    assert stopped.token_ids == whole[: whole.index(whole[1])] and stopped.finish_reason == "stop"
