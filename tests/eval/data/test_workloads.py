"""The synthetic workloads: deterministic, answerable from their own segments, well-formed."""

from __future__ import annotations

import json

import pytest

from hypic_rag.eval.data.workloads import WORKLOADS, make
from hypic_rag.eval.metrics import parse_call
from hypic_rag.prompt_format import TAGS


def _fingerprint(examples):
    return [(ex.query, ex.answers, [(s.kind, s.text) for s in ex.segments]) for ex in examples]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_deterministic_per_seed(workload):
    assert _fingerprint(make(workload, 20, 7)) == _fingerprint(make(workload, 20, 7))
    assert _fingerprint(make(workload, 20, 7)) != _fingerprint(make(workload, 20, 8))


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_answer_comes_from_the_prompt(workload):
    for ex in make(workload, 100, 3):
        context = "".join(s.text for s in ex.segments)
        assert all(s.text.startswith(f"<{TAGS[s.kind]}>") for s in ex.segments)
        if workload == "tool_call":
            call = parse_call(ex.answers[0])
            tools = [json.loads(s.text[len("<tool>") : -len("</tool>\n")]) for s in ex.segments if s.kind == "tool"]
            assert 4 <= len(tools) <= 8
            assert all(
                t["type"] == "function" and set(t["function"]) == {"name", "description", "parameters"} for t in tools
            )
            assert call["name"] in {t["function"]["name"] for t in tools}
            for value in call["arguments"].values():
                assert str(value) in ex.query or str(value) in context
        elif workload == "aggregate":
            assert all(name in context for name in ex.answers[0].split(", "))
        else:
            assert ex.answers[0] in context
        if workload == "single_doc":
            assert 4 <= len(ex.segments) <= 12


def test_unknown_workload_and_bad_n():
    with pytest.raises(ValueError, match="unknown workload 'qa'"):
        make("qa", 1, 0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        make("memory", 0, 0)


def test_agent_steps_follow_from_the_earlier_turns():
    examples = make("agent", 200, 5)
    assert {ex.metric for ex in examples} == {"tool_call", "f1"}
    for ex in examples:
        turns = "".join(s.text for s in ex.segments if s.kind == "turn")
        tools = {json.loads(s.text[len("<tool>") : -len("</tool>\n")])["function"]["name"] for s in ex.segments[:2]}
        if ex.metric == "tool_call":
            call = parse_call(ex.answers[0])
            assert all(str(v) in ex.query or str(v) in turns for v in call["arguments"].values())
        else:
            assert ex.answers[0] in turns.split("result:")[-1]
        assert tools  # schemas come first


def test_people_in_one_example_share_no_first_or_last_name():
    for ex in make("single_doc", 200, 9):
        names = [q.removeprefix("How old is ").removesuffix("?") for q, _ in ex.meta["qa"] if q.startswith("How old")]
        firsts, lasts = zip(*(n.split() for n in names), strict=True)
        assert len(set(firsts)) == len(firsts) and len(set(lasts)) == len(lasts)
