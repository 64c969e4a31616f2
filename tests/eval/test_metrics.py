from __future__ import annotations

import pytest

from hypic_rag.eval.metrics import exact_match, f1, normalize_answer, parse_call, score, tool_call


def test_normalize_answer():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("An apple a day") == "apple day"


def test_f1_from_its_definition():
    assert f1("Ostrava Prime", ["Ostrava Prime"]) == 100.0
    # prediction {ostrava, city}, reference {ostrava, prime}: precision 1/2, recall 1/2
    assert f1("Ostrava city", ["Ostrava Prime"]) == pytest.approx(50.0)
    assert f1("nothing", ["Ostrava"]) == 0.0
    assert f1("Ostrava", ["Brno", "ostrava."]) == 100.0  # best over references


def test_exact_match_and_tool_calls():
    assert exact_match("the Teal.", ["teal"]) == 100.0 and exact_match("teal blue", ["teal"]) == 0.0
    ref = '{"arguments":{"city":"Laronholm"},"name":"get_weather"}'
    assert tool_call('{"name": "get_weather", "arguments": {"city": "Laronholm"}}</a>', [ref]) == 100.0
    assert tool_call('{"name": "get_weather", "arguments": {"city": "Oslo"}}', [ref]) == 0.0
    assert tool_call("not json", [ref]) == 0.0
    assert parse_call('{"name": 3, "arguments": {}}') is None
    with pytest.raises(ValueError, match="unknown metric"):
        score("bleu", "a", ["a"])


def test_rouge_l_is_longbench_s():
    from hypic_rag.eval.metrics import rouge_l

    assert abs(rouge_l("the cat sat on the mat", ["the cat sat on the mat"]) - 100.0) < 1e-4
    # py-rouge's LCS-based F (what LongBench reports): P 0.6, R 0.75 on this pair
    assert abs(rouge_l("the cat sat on the mat", ["the cat was the mat"]) - 100 * 2 * 0.6 * 0.75 / 1.35) < 1e-4
    assert rouge_l("", ["anything"]) == 0.0 and rouge_l("...", ["anything"]) == 0.0
