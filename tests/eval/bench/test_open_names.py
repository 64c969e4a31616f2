"""The made-up-names bench: held-out people whose facts answer its questions, and every part scored as it says."""

from __future__ import annotations

import json

import pytest

from hypic_rag.eval.bench import open_names
from hypic_rag.eval.data.names import HELD_OUT, JOB_NAMERS


def test_its_people_are_the_held_out_namers_and_each_question_is_answered_by_its_document():
    held_out = {c.lower() for n in (*HELD_OUT, JOB_NAMERS["held_out"]) for p in n.pieces for c in p}
    persons = open_names.people(12, seed=0)
    for p, q, a in open_names.questions(persons, seed=0):
        assert p["name"] in q and a in p["doc"] and f"{p['name']} " in p["doc"]
        assert set(p["name"].replace(" ", "").lower()) <= held_out  # every letter of the name from a held-out namer
    assert len({p["name"] for p in persons}) == 12


def test_a_run_scores_each_part_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "open.json"
    open_names.main(["--n", "2", "--parts", "chat,tool_calls,small_talk", "--json", str(out)])
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert report["run"]["benchmark"] == "open_names" and list(parts) == ["chat", "tool_calls", "small_talk"]
    assert parts["chat"]["of"] == 2 and parts["tool_calls"]["of"] == 2 and parts["small_talk"]["of"] == 10
    for part in parts.values():
        hits = part.get("hits", part.get("in_words"))
        assert 0 <= hits <= part["of"] and len(part["misses"]) == min(4, part["of"] - hits)


def test_the_framework_parts_go_through_each_frameworks_default_path(tmp_path, capsys):
    """The official openai client over a loopback server, LlamaIndex's default query engine and LangChain's
    with_structured_output by both methods: each part runs its path end to end and scores what came back."""
    out = tmp_path / "open.json"
    open_names.main(["--n", "1", "--parts", "openai,llamaindex,structured", "--json", str(out)])
    parts = json.loads(out.read_text())["parts"]
    assert parts["openai"]["of"] == parts["llamaindex"]["of"] == 1
    assert set(parts["structured"]) == {"function_calling", "json_schema"}
    for method in parts["structured"].values():
        assert method["of"] == 4 and 0 <= method["fields"] <= 4  # one record's four fields
        # the output grammar holds every answer to the schema: a miss is a wrong value, never a refused answer
        assert not [got for got, _ in method["misses"] if got.startswith("<")]


@pytest.mark.parametrize(("argv", "match"), [(["--parts", "chat,nope"], "unknown nope"), (["--n", "0"], "1 to 200")])
def test_bad_flags_are_refused_before_any_work(argv, match, capsys):
    with pytest.raises(SystemExit):
        open_names.main(argv)
    assert match in capsys.readouterr().err
