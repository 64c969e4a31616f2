"""LongBench's JSONL schema: the workloads' examples written and read back."""

from __future__ import annotations

import json

import pytest

from hypic_rag.eval.data.longbench import read_longbench_jsonl, write_longbench_jsonl
from hypic_rag.eval.data.workloads import make


def test_longbench_jsonl_round_trip(tmp_path):
    examples = make("multi_hop", 5, 1)
    path = tmp_path / "multi_hop.jsonl"
    assert write_longbench_jsonl(examples, path) == 5
    row = json.loads(path.read_text().splitlines()[0])
    assert set(row) >= {"input", "context", "answers", "length", "dataset", "_id"}
    back = read_longbench_jsonl(path)
    assert [b.query for b in back] == [e.query for e in examples]
    assert [b.answers for b in back] == [e.answers for e in examples]
    assert [b.metric for b in back] == ["f1"] * 5
    assert [[s.text.strip() for s in b.segments] for b in back] == [
        [s.text.strip() for s in e.segments] for e in examples
    ]
    (tmp_path / "bad.jsonl").write_text('{"input": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1 is not a LongBench-schema row"):
        read_longbench_jsonl(tmp_path / "bad.jsonl")
