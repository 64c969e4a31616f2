"""The examples run offline on the bundled model, answer right and report the engine's cache stats."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hypic_rag.eval.data import corpus

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rag_examples_send_three_documents_per_question_and_answer_right():
    for name, seed in (("rag_langchain", 3), ("rag_llamaindex", 4)):
        rows = _load(name).main(questions=2)
        assert len(rows) == 2
        assert all(stats["hit_segments"] + stats["miss_segments"] == 3 for _, _, stats in rows)
        expected = dict(corpus(16, seed)[1])
        assert all(answer == expected[question] for question, answer, _ in rows)


def test_agent_example_completes_its_two_tool_task():
    result = _load("agent_tools").main()
    assert [step.call[0] for step in result.trace[:-1]] == ["lookup_employee", "get_weather"]
    assert result.stopped == "answer" and result.answer == "light rain, 12 degrees"
