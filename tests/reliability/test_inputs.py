"""Bad input gets a ValueError that names it, at every public edge; Hypothesis throws arguments of every type at
``generate`` and ``chat``, and nothing but a ValueError (or an answer) comes back."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypic_rag import Engine, Segment
from hypic_rag.integrations.agent import Tool, ToolAgent
from hypic_rag.options import FALLBACK

from .conftest import QUESTION, engine, segments

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
    st.text(max_size=5),
    st.lists(st.integers(-5, 400), max_size=3),
)


@pytest.fixture(scope="module")
def bundled() -> Engine:
    return engine()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "seed", "max_new_tokens", "seam"]), ANY))
def test_generate_answers_or_raises_value_error(bundled, kwargs):
    try:
        out = bundled.generate(segments()[:1], QUESTION, **{"max_new_tokens": 2, **kwargs})
    except ValueError:
        return
    limit = kwargs.get("max_new_tokens", 2)  # None: unset, so the default
    limit = FALLBACK["max_new_tokens"] if limit is None else limit
    assert isinstance(out.token_ids, list) and 1 <= len(out.token_ids) <= limit


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["temperature", "top_p", "seed", "max_new_tokens", "stop", "tool_choice"]), ANY))
def test_chat_answers_or_raises_value_error(bundled, kwargs):
    try:
        bundled.chat([{"role": "user", "content": QUESTION}], **{"max_new_tokens": 2, **kwargs})
    except ValueError:
        pass


CASES = [
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"seed": "x"}, "seed"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"seam": float("nan")}, "seam"),
    ({"top_p": float("nan")}, "top_p"),
    ({"mode": "fast"}, "mode"),
]


@pytest.mark.parametrize(("kwargs", "name"), CASES)
def test_each_bad_argument_is_named(bundled, kwargs, name):
    with pytest.raises(ValueError, match=name):
        bundled.generate(segments()[:1], QUESTION, **kwargs)


def test_bad_text_segments_and_engine_options(tmp_path, bundled):
    with pytest.raises(ValueError, match="not valid Unicode"):
        Segment("a lone \ud800 surrogate")
    with pytest.raises(ValueError, match="not valid Unicode"):
        bundled.generate([], "a lone \udfff surrogate")
    with pytest.raises(ValueError, match="token_ids must be a list"):
        Segment(token_ids=(i for i in range(3)))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            Engine.from_pretrained(device="cuda")
    with pytest.raises(ValueError, match="not a torch device"):
        Engine.from_pretrained(device="abacus")
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        Engine.from_pretrained(cache_dir=file)
    with pytest.raises(ValueError, match="memory_bytes"):
        Engine.from_pretrained(memory_bytes=-1)
    with pytest.raises(ValueError, match="pass a Redis URL as cache_url"):
        Engine.from_pretrained(cache_dir="redis://127.0.0.1:6379/0")  # never a folder named "redis:"


def test_a_config_with_no_context_is_refused(tmp_path):
    import shutil

    from hypic_rag.model.loading import default_model_path

    out = tmp_path / "broken"
    shutil.copytree(default_model_path(), out)
    config = json.loads((out / "config.json").read_text())
    config["max_position_embeddings"] = 0
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="max_position_embeddings must be >= 1"):
        Engine.from_pretrained(out)


def test_the_agent_bounds_tools_and_encodes_their_results(bundled):
    release, finished = threading.Event(), threading.Event()

    def slow(city: str) -> str:
        release.wait(30)
        finished.set()
        return "sunny"

    def odd(city: str) -> dict:
        return {"forecast": {1, 2}}  # a set: JSON cannot encode it

    agent = ToolAgent([Tool.from_function(slow), Tool.from_function(odd)], bundled, tool_timeout_s=0.2)
    result, error = agent._call("slow", {"city": "Oslo"})
    assert not finished.is_set()  # the call came back while the tool still runs
    assert "did not return within" in error and result == {"error": error}
    release.set()
    result, error = agent._call("odd", {"city": "Oslo"})
    assert "not JSON serializable" in error and result == {"error": error}
    with pytest.raises(ValueError, match="memory must be a list of strings"):
        ToolAgent([Tool.from_function(slow)], memory="abc")
    with pytest.raises(ValueError, match="tool_timeout_s"):
        ToolAgent([Tool.from_function(slow)], tool_timeout_s=math.nan)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"min_cached_tokens": -1}, "min_cached_tokens"),
        ({"min_cached_tokens": 2.5}, "min_cached_tokens"),
        ({"disk_bytes": 0}, "disk_bytes"),
        ({"fuse_forwards": "yes"}, "fuse_forwards"),
        ({"seam": -3}, "seam"),
        ({"seam_variant": "C"}, "seam_variant"),
        ({"cold_policy": "lazy"}, "cold_policy"),
    ],
)
def test_bad_engine_options_are_named(options, name):
    with pytest.raises(ValueError, match=name):
        Engine.from_pretrained(**options)
