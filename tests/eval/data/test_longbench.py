"""LongBench's JSONL schema: the workloads' examples written and read back."""

from __future__ import annotations

import json

import pytest

from hypic_rag.eval.data.longbench import passages, read_longbench_jsonl, write_longbench_jsonl
from hypic_rag.eval.data.workloads import make


def test_longbench_jsonl_round_trip(tmp_path):
    examples = make("multi_hop", 5, 1)
    path = tmp_path / "multi_hop.jsonl"
    assert write_longbench_jsonl(examples, path) == 5
    row = json.loads(path.read_text().splitlines()[0])
    assert set(row) >= {"input", "context", "answers", "length", "dataset", "_id"}
    assert row["context"] == "\n\n".join(p["text"] for p in examples[0].messages[0]["content"][:-1])  # plain text
    back = read_longbench_jsonl(path)
    assert [b.query for b in back] == [e.query for e in examples]
    assert [b.answers for b in back] == [e.answers for e in examples]
    assert [b.metric for b in back] == ["f1"] * 5
    # each passage a document part again: the same messages, so the same prompt
    assert [b.messages for b in back] == [e.messages for e in examples]
    assert [b.segments for b in back] == [e.segments for e in examples]
    (tmp_path / "bad.jsonl").write_text('{"input": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1 is not a LongBench-schema row"):
        read_longbench_jsonl(tmp_path / "bad.jsonl")


def test_tool_schemas_calls_and_results_are_passages():
    ex = next(e for e in make("agent", 20, 2) if len(e.messages) > 1)
    parts = passages(ex)
    assert [json.loads(p) for p in parts[: len(ex.tools)]] == ex.tools
    assert json.loads(parts[len(ex.tools)])["name"] == ex.messages[1]["tool_calls"][0]["function"]["name"]
    assert parts[len(ex.tools) + 1] == ex.messages[2]["content"]


def test_passages_are_stripped_documents_before_the_question(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"input": "Who?", "context": "\nAna lives in Oslo.\n\n\n\nBo is 4. ", "answers": [1]}))
    (ex,) = read_longbench_jsonl(path)
    assert ex.query == "Who?" and ex.answers == ["1"] and ex.tools is None
    assert [(s.kind, s.text) for s in ex.segments] == [
        ("document", "<doc>Ana lives in Oslo.</doc>\n"),
        ("document", "<doc>Bo is 4.</doc>\n"),
    ]


def _row(dataset: str, **extra) -> str:
    return json.dumps({"input": "q", "context": "a passage", "answers": ["x"], "dataset": dataset, **extra})


def test_each_longbench_dataset_is_scored_with_its_own_metric(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [
        _row("hotpotqa"),
        _row("gov_report"),
        _row("trec", all_classes=["Abbreviation", "Entity"]),
        _row("passage_count"),
        _row("lcc"),
        _row("tool_call"),
        _row("someone_elses"),
    ]
    path.write_text("\n".join(rows) + "\n")
    back = read_longbench_jsonl(path)
    assert [b.metric for b in back] == ["f1", "rouge_l", "classification", "count", "code_sim", "tool_call", "f1"]
    assert back[2].meta["all_classes"] == ["Abbreviation", "Entity"] and back[0].meta["all_classes"] is None
    path.write_text(_row("lsht") + "\n")
    with pytest.raises(ValueError, match="dataset 'lsht' is scored by class and needs all_classes"):
        read_longbench_jsonl(path)
    path.write_text(_row("trec", all_classes="Entity") + "\n")
    with pytest.raises(ValueError, match="all_classes must be a list of strings"):
        read_longbench_jsonl(path)
