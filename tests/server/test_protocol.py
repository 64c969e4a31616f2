"""The wire format's request options: OpenAI's body fields and the ``hypic`` extension become one
``RequestOptions``, over the server's default mode; a bad one is a 400 naming where it was."""

from __future__ import annotations

import pytest

from hypic_rag.options import OPTIONS, RequestOptions
from hypic_rag.server.protocol import APIError, parse_request, request_options

MESSAGES = [{"role": "user", "content": "hi"}]


def _options(default_mode: str = "hypic", **body) -> RequestOptions:
    return request_options(parse_request({"model": "m", "messages": MESSAGES, **body}), default_mode)


def test_body_fields_and_the_extension_become_the_request_options():
    options = _options(
        "full",
        max_completion_tokens=5,
        temperature=0.5,
        top_p=0.9,
        top_k=0,
        seed=3,
        stop="END",
        chat_template_kwargs={"enable_thinking": False},
        user="someone",  # OpenAI fields that are not options are left alone
        hypic={"seam": 4, "segmentation": "explicit"},
    )
    assert options == RequestOptions(
        mode="full",
        seam=4,
        max_new_tokens=5,
        temperature=0.5,
        top_p=0.9,
        top_k=0,
        seed=3,
        stop=("END",),
        segmentation="explicit",
        chat_template_kwargs={"enable_thinking": False},
    )
    assert _options(hypic={"mode": "pic"}, temperature=None).mode == "pic"  # null: unset
    assert _options().mode == "hypic" and _options("prefix").mode == "prefix"
    # every option may be given in the extension, by the engine's own name
    defaults = RequestOptions()
    assert _options(hypic=defaults.as_dict()) == defaults and len(defaults.as_dict()) == len(OPTIONS)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"temperature": 3}, "temperature", "OpenAI's range"),
        ({"temperature": "hot"}, "temperature", "temperature must be a finite number"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1"),
        ({"max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens", "disagree"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"stop": ["x" * 100_000] * 4}, "stop", "4,096 characters in all"),
        ({"hypic": {"mode": "fast"}}, "hypic.mode", "hypic.mode: unknown mode 'fast'"),
        ({"hypic": {"seem": 4}}, "hypic.seem", "'seem' is not a request option"),
        ({"hypic": {"seam": 1.5}}, "hypic.seam", "fractional seam"),
    ],
)
def test_a_bad_option_is_a_400_that_names_it(body, param, message):
    with pytest.raises(APIError, match=message) as caught:
        _options(**body)
    assert caught.value.status == 400 and caught.value.param == param
