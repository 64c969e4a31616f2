"""The examples run offline on the bundled model and report the engine's cache stats."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rag_examples_send_three_documents_per_question():
    for name in ("rag_langchain", "rag_llamaindex"):
        rows = _load(name).main(questions=2)
        assert len(rows) == 2
        assert all(stats["hit_segments"] + stats["miss_segments"] == 3 for _, _, stats in rows)


def test_agent_example_stops_within_its_cap():
    result = _load("agent_tools").main()
    assert 1 <= len(result.trace) <= 4 and result.stopped in ("answer", "max_steps")
