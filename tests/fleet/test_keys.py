"""The ingress's segment keys, computed without the model, are the keys the engine's own plan files segments under."""

from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.chat.segmentation import SEGMENTATIONS
from hypic_rag.fleet.keys import KeySpec, RequestKeys
from hypic_rag.hub import resolve_checkpoint

DOCS = [
    "Stithgo Dithgaith lives in Kothvenville and works as a pilot at Krudrel Labs since the spring.",
    "Ana Lee lives in Oslo and works as a baker; she has two cats and a bicycle.",
    "Bo Ek lives in Rome and works as a nurse at the city hospital near the river.",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained(min_cached_tokens=1)


@pytest.fixture(scope="module")
def keys(engine) -> RequestKeys:
    described = {
        "fingerprint": engine.fingerprint,
        "dtype": str(engine.model.dtype),
        "min_cached_tokens": engine.min_cached_tokens,
    }
    return RequestKeys(resolve_checkpoint(None), KeySpec.of(described))


def body(order: list[int], mode: str | None = "hypic", **extra) -> dict:
    parts = [{"type": "text", "text": DOCS[i] + "\n\n", "hypic": {"kind": "document"}} for i in order]
    question = {"type": "text", "text": "Where does Bo Ek live?"}
    out = {"model": "hypic-default", "messages": [{"role": "user", "content": [*parts, question]}], **extra}
    if mode is not None:
        out["hypic"] = {"mode": mode}
    return out


def recorded_keys(engine: Engine, monkeypatch, run) -> list[str]:
    """The keys of the segments the engine's plans look up while ``run()`` runs."""
    seen: list[str] = []
    real = engine.prefill_program.plan

    def recording(*args, **kwargs):
        plan = real(*args, **kwargs)
        seen.extend(s.key for s in plan.segments if s.key is not None)
        return plan

    monkeypatch.setattr(engine.prefill_program, "plan", recording)
    run()
    monkeypatch.undo()
    return sorted(set(seen))


def planned_keys(engine: Engine, monkeypatch, request: dict) -> list[str]:
    """The keys of the segments the engine's plan looks up for ``request``, as the server would run it."""
    from hypic_rag.server.protocol import engine_arguments, parse_request

    arguments = engine_arguments(parse_request(request | {"max_tokens": 1}), "hypic", engine.chat_setup.format)
    return recorded_keys(engine, monkeypatch, lambda: engine.chat(**arguments))


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": [WEATHER]}, {"response_format": SCHEMA}, {"tools": [WEATHER], "tool_choice": "required"}],
    ids=["documents", "tools", "response_format", "tool_choice"],
)
def test_ingress_keys_are_the_plans_keys_in_any_order(engine, keys, monkeypatch, extra):
    ours = keys.of_body(body([0, 1, 2], **extra))
    assert len(ours) >= 3  # each document at least, and a tool schema where there is one
    assert ours == planned_keys(engine, monkeypatch, body([0, 1, 2], **extra))
    assert keys.of_body(body([2, 0, 1], **extra)) == ours


@pytest.mark.parametrize("segmentation", SEGMENTATIONS)
@pytest.mark.parametrize(
    "extra", [{}, {"tools": [WEATHER]}, {"response_format": SCHEMA}], ids=["docs", "tools", "response_format"]
)
def test_ingress_keys_are_the_replicas_plan_keys_under_every_segmentation(engine, keys, extra, segmentation):
    """The ingress prepares a request with the replica's own ``Preparer`` and keys it by the plan's own cache rule, so
    for every way of cutting messages into segments its keys are the ones the replica's plan looks up."""
    from hypic_rag.server.protocol import engine_arguments, parse_request

    request = body([0, 1, 2], **extra)
    request["hypic"]["segmentation"] = segmentation
    arguments = engine_arguments(parse_request(request), "hypic", engine.chat_setup.format)
    plan = engine.plan(engine.prepare_chat(**arguments).prompt)
    planned = sorted({s.key for s in plan.segments if s.key is not None})
    assert keys.of_body(request) == planned
    if segmentation != "none":
        assert len(planned) >= 3  # each document at least


def test_modes_that_do_not_compose_have_no_keys_and_bad_bodies_none(keys):
    assert keys.of_body(body([0, 1], mode="full")) == []
    assert keys.of_body(body([0, 1], mode="prefix")) == []
    assert keys.of_body(body([0, 1], mode=None)) == keys.of_body(body([0, 1]))  # the default mode is hypic
    assert keys.of_body({"messages": "not a list"}) == []
    assert keys.of_body(b"\xff") == []


def test_completion_keys_are_the_plans_keys_in_any_order(engine, keys, monkeypatch):
    """A ``/v1/completions`` prompt is cut at its paragraphs by the replica; the ingress cuts it the same way."""
    from hypic_rag.server.completions import completion_arguments, parse_completion_request

    def prompt(order):
        return "Context:\n" + "\n\n".join(DOCS[i] for i in order) + "\n\nQuestion: where does Bo Ek live?"

    request = {"model": "hypic-default", "prompt": [prompt([0, 1, 2]), prompt([1, 2])], "max_tokens": 1}
    ours = keys.of_completion_body(request)
    parsed = parse_completion_request(request)

    def run():
        for one in request["prompt"]:
            engine.generate(**completion_arguments(parsed, one, "hypic"), max_new_tokens=1)

    assert len(ours) == 3 and ours == recorded_keys(engine, monkeypatch, run)
    assert keys.of_completion_body(request | {"prompt": prompt([2, 1, 0])}) == ours
    assert keys.of_completion_body(request | {"hypic": {"mode": "full"}}) == []
    assert keys.of_completion_body({"prompt": 7}) == [] and keys.of_completion_body({"model": "x"}) == []


def test_a_dtype_that_is_not_torchs_is_refused():
    with pytest.raises(ValueError, match="not a torch dtype: 'torch.float99'"):
        _ = KeySpec("f", "torch.float99", 1).torch_dtype
