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
        rows = _load(name).main(questions=4)
        assert len(rows) == 4
        assert all(stats["hit_segments"] + stats["miss_segments"] == 3 for _, _, stats in rows)
        expected = dict(corpus(16, seed)[1])
        assert [answer for _, answer, _ in rows] == [expected[question] for question, _, _ in rows]
        if name == "rag_langchain":  # its corpus was cached when indexed
            assert all(stats["hit_segments"] == 3 for _, _, stats in rows)


def test_agent_example_completes_its_two_tool_task():
    result = _load("agent_tools").main()
    assert [step.call[0] for step in result.trace[:-1]] == ["lookup_employee", "get_weather"]
    assert result.stopped == "answer" and result.answer == "light rain, 12 degrees"


def test_own_checkpoint_example_loads_a_hub_id_and_reuses_reordered_documents_on_every_path(
    chat_checkpoint, tmp_path, monkeypatch
):
    from hypic_rag.testing.synthetic import place_in_hub_cache

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    place_in_hub_cache(chat_checkpoint, tmp_path / "hf", "example-org/qwen-style")
    example = _load("own_checkpoint")
    stats = example.main("example-org/qwen-style")
    docs = len(example.DOCS)
    # The second request finds every document, the system prompt and the tool schema in the cache.
    assert stats["chat"][0]["hit_segments"] == 0 and stats["chat"][1]["hit_segments"] == docs + 2
    assert stats["langchain"][1]["hit_segments"] >= docs
    assert stats["llamaindex"][1]["hit_segments"] >= docs
