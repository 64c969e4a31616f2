from __future__ import annotations

import json

import pytest

from hypic_rag import Engine, Segment
from hypic_rag.integrations.prompting import REGISTRY


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The bundled model; its short documents are cached whatever their length, so hits show."""
    return Engine.from_pretrained(min_cached_tokens=1)


@pytest.fixture(autouse=True)
def fresh_registry():
    REGISTRY.clear()
    yield
    REGISTRY.clear()


class BundledFormat:
    """The bundled model's prompt format spelled out literally: an oracle independent of its chat
    template, so the tests catch a template (or a path through it) that drifts from what it was
    trained on."""

    TAGS = {"system": "sys", "document": "doc", "tool": "tool", "memory": "mem", "turn": "turn"}

    @staticmethod
    def segment(kind: str, text: str) -> Segment:
        tag = BundledFormat.TAGS[kind]
        return Segment(f"<{tag}>{text.strip()}</{tag}>\n", kind=kind)

    @staticmethod
    def query(text: str) -> Segment:
        return Segment(f"<q>{' '.join(text.split())}</q>\n<a>", kind="query")

    @staticmethod
    def tool_segment(schema: dict) -> Segment:
        return BundledFormat.segment("tool", json.dumps(schema, separators=(",", ":")))

    @staticmethod
    def step_segment(name: str, arguments: dict, result: object) -> Segment:
        call = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"), sort_keys=True)
        if not isinstance(result, str):
            result = json.dumps(result, separators=(",", ":"), sort_keys=True)
        return BundledFormat.segment("turn", f"call: {call}\nresult: {result}")

    @staticmethod
    def stop_ids(engine: Engine) -> list[int]:
        return [engine.tokenizer.token_to_id("</a>")]

    @staticmethod
    def answer(text: str | None) -> str:
        return (text or "").split("</a>")[0].strip()


@pytest.fixture(scope="session")
def fmt() -> type[BundledFormat]:
    return BundledFormat
