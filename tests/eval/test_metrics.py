"""The metrics against hand-derived values; each LongBench case follows LongBench's definition."""

from __future__ import annotations

import pytest

from hypic_rag.eval.metrics import (
    FIRST_LINE_DATASETS,
    LONGBENCH_METRICS,
    METRICS,
    PAIR_METRICS,
    class_match,
    code_line_similarity,
    count_match,
    exact_match,
    f1,
    fuzz_ratio,
    normalize_answer,
    normalize_zh_answer,
    paragraph_id_en,
    paragraph_id_zh,
    parse_call,
    rouge_l,
    rouge_l_f,
    rouge_l_f_zh,
    score,
    token_f1,
    token_f1_zh,
    tool_call,
)

TOL = 1e-6


def _rouge_f(p: float, r: float) -> float:
    """py-rouge's F: 2PR / (P + R + 1e-8)."""
    return 2 * p * r / (p + r + 1e-8)


@pytest.fixture(scope="module")
def jieba():
    import logging

    import jieba  # the eval extra, which `make test` installs: a missing one must fail, not skip

    jieba.setLogLevel(logging.WARNING)
    return jieba


def test_normalize_answer():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("An apple a day") == "apple day"


def test_normalize_zh_answer():
    # lower -> "hello，世界！ a b"; drop "，" and "！"; remove every whitespace
    assert normalize_zh_answer("Hello，世界！ A b") == "hello世界ab"
    # LongBench's punctuation list has 》 but not 《, and no full-width full stop ．
    assert normalize_zh_answer("《书》．") == "《书．"


def test_f1_from_its_definition():
    assert f1("Ostrava Prime", ["Ostrava Prime"]) == 100.0
    # prediction {ostrava, city}, reference {ostrava, prime}: precision 1/2, recall 1/2
    assert f1("Ostrava city", ["Ostrava Prime"]) == pytest.approx(50.0)
    assert f1("nothing", ["Ostrava"]) == 0.0
    assert f1("Ostrava", ["Brno", "ostrava."]) == 100.0  # best over references
    assert f1("Ostrava", []) == 0.0


def test_qa_f1_articles_punctuation_and_multisets():
    # "The answer is: an Apple, Inc." -> lower, drop punctuation -> "the answer is an apple inc"
    # -> drop articles -> [answer, is, apple, inc]; reference [apple, inc]: common 2,
    # precision 2/4, recall 2/2 -> F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert abs(token_f1("The answer is: an Apple, Inc.", "Apple Inc") - 2 / 3) < TOL
    # multisets: [paris, paris] vs [paris]: common min(2, 1) = 1, precision 1/2, recall 1 -> 2/3
    assert abs(token_f1("Paris Paris", "paris") - 2 / 3) < TOL
    # only articles and punctuation on one side: no tokens, no overlap -> 0
    assert token_f1("The.", "the") == 0.0


def test_qa_f1_zh_on_jieba_words(jieba):
    # jieba: 北京是中国的首都。 -> [北京, 是, 中国, 的, 首都, 。]; 首都是北京 -> [首都, 是, 北京]
    assert list(jieba.cut("北京是中国的首都。", cut_all=False)) == ["北京", "是", "中国", "的", "首都", "。"]
    assert list(jieba.cut("首都是北京", cut_all=False)) == ["首都", "是", "北京"]
    # 。 normalises to "" and is dropped: 5 prediction words, 3 reference words, common {北京, 是, 首都} = 3
    # precision 3/5, recall 3/3 -> F1 = 2 * 0.6 * 1 / 1.6 = 0.75
    assert abs(token_f1_zh("北京是中国的首都。", "首都是北京") - 0.75) < TOL
    assert abs(score("f1_zh", "北京是中国的首都。", ["上海", "首都是北京"]) - 75.0) < 1e-4


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
    assert abs(rouge_l("the cat sat on the mat", ["the cat sat on the mat"]) - 100.0) < 1e-4
    # distinct words: prediction {police, killed, the, gunman} (4), reference {police, kill, the, gunman}
    # (4); LCS police-the-gunman = 3 -> P = R = 3/4 -> F = 0.75 (less py-rouge's 1e-8)
    assert abs(rouge_l_f("police killed the gunman", "police kill the gunman") - _rouge_f(0.75, 0.75)) < TOL
    # py-rouge counts distinct words: prediction {the, cat, sat, on, mat} (5), reference {the, cat, was,
    # mat} (4); the LCS the-cat-the-mat has the distinct words {the, cat, mat} (3) -> P 3/5, R 3/4
    assert abs(rouge_l("the cat sat on the mat", ["the cat was the mat"]) - 100 * _rouge_f(0.6, 0.75)) < 1e-4
    # summary level, sentences split at ".": reference "a b c d e"; prediction sentences "a b f g h" (LCS
    # a-b) and "a c h i e" (LCS a-c-e); union {a, b, c, e} = 4; distinct reference words 5, prediction
    # words {a, b, f, g, h, c, i, e} = 8 -> R 4/5, P 4/8 -> F = 2 * 0.4 / 1.3 = 0.6154
    assert abs(rouge_l_f("a b f g h. a c h i e", "a b c d e") - _rouge_f(0.5, 0.8)) < TOL


def test_rouge_l_empty_and_whitespace_as_longbench():
    # Whitespace-only text is one sentence holding the empty word "": two of them match fully.
    assert abs(rouge_l_f("   ", "\n ") - _rouge_f(1.0, 1.0)) < TOL
    assert abs(rouge_l("   ", ["\n "]) - 99.9999995) < 1e-6
    assert rouge_l_f("   ", "abc") == 0.0 and rouge_l_f("abc", " ") == 0.0  # "" shares nothing with "abc"
    # Empty text, or only dots, has no sentence: py-rouge raises, LongBench scores 0.
    assert rouge_l("", ["anything"]) == 0.0 and rouge_l("...", ["anything"]) == 0.0
    assert rouge_l_f("abc", "") == 0.0
    # A ". " at the end leaves the sentence " " -> the empty word: prediction {x, ""} (2), reference
    # {x} (1), LCS x -> P 1/2, R 1 -> F = 2 * 0.5 / 1.5 = 2/3
    assert abs(rouge_l_f("x. ", "x") - _rouge_f(0.5, 1.0)) < TOL


def test_rouge_l_is_zero_where_py_rouge_recurses_too_deep():
    # py-rouge rebuilds the LCS recursively, one frame per word of a sentence; past Python's recursion
    # limit it raises RecursionError, which LongBench's bare except turns into 0. The limit is lowered
    # here so that a 400-word sentence reaches it.
    import inspect
    import sys

    sentence = " ".join(f"w{i}" for i in range(400))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)
    try:
        assert rouge_l_f(sentence, sentence) == 0.0
    finally:
        sys.setrecursionlimit(limit)
    assert abs(rouge_l_f(sentence, sentence) - _rouge_f(1.0, 1.0)) < TOL  # under the usual limit


def test_rouge_l_zh_on_jieba_words(jieba):
    # 我喜欢北京天安门 -> "我 喜欢 北京 天安门" (4 words); 我喜欢北京 -> "我 喜欢 北京" (3 words)
    assert list(jieba.cut("我喜欢北京天安门", cut_all=False)) == ["我", "喜欢", "北京", "天安门"]
    assert list(jieba.cut("我喜欢北京", cut_all=False)) == ["我", "喜欢", "北京"]
    # LCS 我-喜欢-北京 = 3 -> P 3/4, R 3/3 -> F = 2 * 0.75 / 1.75 = 0.857
    assert abs(rouge_l_f_zh("我喜欢北京天安门", "我喜欢北京") - _rouge_f(0.75, 1.0)) < TOL


def test_classification_as_longbench():
    classes = ["animal", "other animal", "plant"]
    # named: [animal, other animal]; "animal" is a proper substring of the reference -> removed;
    # left [other animal], the reference -> 1/1
    assert class_match("It is an other animal.", "other animal", all_classes=classes) == 1.0
    # named: [animal, plant]; neither is a proper substring of "plant" -> 1/2
    assert class_match("animal or plant", "plant", all_classes=classes) == 0.5
    assert class_match("animal", "plant", all_classes=classes) == 0.0
    # No class named: 0. (LongBench's closest-class fallback sits behind `list != 0` and never runs.)
    assert class_match("mineral", "animal", all_classes=classes) == 0.0
    # LongBench's skip: named [animal, other, other animal]; removing "animal" (index 0) shifts "other"
    # to index 0 and the walk goes on at index 1, so "other" is never checked and stays -> 1/2
    skip = ["animal", "other", "other animal", "plant"]
    assert class_match("other animal", "other animal", all_classes=skip) == 0.5
    assert score("classification", "other animal", ["other animal"], all_classes=skip) == 50.0
    with pytest.raises(ValueError, match="all_classes"):
        class_match("plant", "plant")


def test_retrieval_en_and_zh():
    assert paragraph_id_en("Paragraph 12", "Paragraph 12") == 1.0
    # numbers in the prediction [12, 3]; one equals 12 -> 1/2
    assert paragraph_id_en("Paragraph 12, not Paragraph 3", "Paragraph 12") == 0.5
    assert paragraph_id_en("Paragraph 120", "Paragraph 12") == 0.0  # "120" != "12"
    assert paragraph_id_en("I don't know", "Paragraph 12") == 0.0  # no numbers
    assert score("retrieval_en", "Paragraph 3", ["Paragraph 12", "Paragraph 3"]) == 100.0
    # numbers [5, 15]; one equals 5 -> 1/2
    assert paragraph_id_zh("答案是段落5，不是段落15", "段落5") == 0.5
    assert paragraph_id_zh("段落5", "段落5") == 1.0
    with pytest.raises(ValueError, match="paragraph id"):
        paragraph_id_en("1", "no id here")


def test_count():
    # numbers [4, 7, 4]; two equal "4" -> 2/3
    assert abs(count_match("There are 4 unique paragraphs out of 7, so 4", "4") - 2 / 3) < TOL
    assert count_match("04", "4") == 0.0  # digit strings compared, not values
    assert count_match("four", "4") == 0.0
    assert abs(score("count", "1 2 3", ["3", "2"]) - 100 / 3) < 1e-4


def test_code_similarity_and_fuzzywuzzy_rounding():
    # The first line with no backtick, "#" or "//" is "return a + b", equal to the reference -> 100
    assert code_line_similarity("```python\n# add them\n// or so\nreturn a + b\nprint(x)", "return a + b") == 1.0
    # leading newlines are skipped; "return a - b" vs "return a + b": LCS "return a " + " b" = 11 chars,
    # ratio 2 * 11 / 24 = 91.67 -> 92
    assert code_line_similarity("\n\nreturn a - b", "return a + b") == 0.92
    # leading spaces are kept: LCS 8 of 12 + 8 chars -> 2 * 8 / 20 = 80
    assert code_line_similarity("    return a", "return a") == 0.8
    # every line has a marker -> the empty string -> 0 against a non-empty reference, 100 against ""
    assert code_line_similarity("# only\n`x`", "return 1") == 0.0
    assert code_line_similarity("# only", "") == 1.0
    # fuzzywuzzy's int(round(x)) rounds half to even: LCS 1 of 8 + 8 -> 12.5 -> 12 (not 13);
    # LCS 3 of 8 + 8 -> 37.5 -> 38
    assert fuzz_ratio("abcdefgh", "aXXXXXXX") == 12
    assert fuzz_ratio("abcdefgh", "abcXXXXX") == 38
    assert code_line_similarity("abcdefgh", "aXXXXXXX") == 0.12


def test_first_line_rule():
    # triviaqa keeps "Paris" -> 100; elsewhere the whole text: [paris, capital, of, france, is, paris]
    # vs [paris]: common 1, precision 1/6, recall 1 -> F1 = 2 * (1/6) / (7/6) = 2/7
    text = "\n\nParis\nThe capital of France is Paris."
    assert score("f1", text, ["Paris"], dataset="triviaqa") == 100.0
    assert score("f1", text, ["Paris"], dataset="triviaqa_e") == 100.0
    assert abs(score("f1", text, ["Paris"], dataset="hotpotqa") - 200 / 7) < 1e-4
    assert abs(score("f1", text, ["Paris"]) - 200 / 7) < 1e-4
    # trec: the first line names only "Location" -> 0; the whole text names both -> 1/2
    classes = ["Location", "Human being", "Number"]
    pred = "Location\nHuman being"
    assert score("classification", pred, ["Human being"], all_classes=classes, dataset="trec") == 0.0
    assert score("classification", pred, ["Human being"], all_classes=classes) == 50.0
    # lsht, likewise in Chinese
    assert score("classification", "\n体育\n财经", ["财经"], all_classes=["体育", "财经"], dataset="lsht") == 0.0
    assert score("classification", "\n体育\n财经", ["财经"], all_classes=["体育", "财经"], dataset="vcsum") == 50.0
    # samsum: "a b" alone matches the reference (F ~1); the whole "a b c d" has P 2/4, R 1 -> 2/3
    assert abs(score("rouge_l", "a b\nc d", ["a b"], dataset="samsum") - 100 * _rouge_f(1.0, 1.0)) < 1e-4
    assert abs(score("rouge_l", "a b\nc d", ["a b"], dataset="gov_report") - 100 * _rouge_f(0.5, 1.0)) < 1e-4


def test_longbench_dataset_table():
    expected = {
        "narrativeqa": "f1", "qasper": "f1", "multifieldqa_en": "f1", "multifieldqa_zh": "f1_zh",
        "hotpotqa": "f1", "2wikimqa": "f1", "musique": "f1", "dureader": "rouge_l_zh",
        "gov_report": "rouge_l", "qmsum": "rouge_l", "multi_news": "rouge_l", "vcsum": "rouge_l_zh",
        "trec": "classification", "triviaqa": "f1", "samsum": "rouge_l", "lsht": "classification",
        "passage_retrieval_en": "retrieval_en", "passage_count": "count", "passage_retrieval_zh": "retrieval_zh",
        "lcc": "code_sim", "repobench-p": "code_sim",
    }  # fmt: skip
    longbench_e = [
        "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
        "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
    ]  # fmt: skip
    expected |= {f"{name}_e": expected[name] for name in longbench_e}
    assert LONGBENCH_METRICS == expected and len(LONGBENCH_METRICS) == 21 + 13
    assert set(LONGBENCH_METRICS.values()) <= set(METRICS)
    assert set(PAIR_METRICS) == set(METRICS)
    assert FIRST_LINE_DATASETS == {"trec", "triviaqa", "samsum", "lsht", "trec_e", "triviaqa_e", "samsum_e"}
