"""Answer metrics: LongBench's per-dataset metrics, SQuAD's exact match, and our tool-call check.

Two scales, one convention:

- A *pair scorer* (``PAIR_METRICS``) compares one prediction with one reference and returns a float
  in [0, 1]: ``pair(prediction, reference, *, all_classes=None)``.
- A *metric* (``METRICS``, and ``score``) takes every reference of an example and returns the best
  pair score x 100: ``metric(prediction, references, *, all_classes=None)``. That is LongBench's
  per-example score (``max`` over the ground truths, starting from 0) on the 0-100 scale LongBench
  reports; the mean over a dataset is LongBench's dataset score before its ``round(..., 2)``.

The LongBench metrics follow the definitions in THUDM/LongBench (``metrics.py`` and the scorer in
``eval.py``). LongBench is a collection of scripts, not an installable library, so they are written
here from those definitions and checked against them case by case in ``tests/eval/test_metrics.py``.

Metric names, with the LongBench function each one follows:

- ``f1`` (``qa_f1_score``): F1 of the token multisets of the ``normalize_answer``-ed texts.
- ``f1_zh`` (``qa_f1_zh_score``): the same over jieba words, each ``normalize_zh_answer``-ed, empty
  words dropped.
- ``rouge_l`` (``rouge_score``): ROUGE-L F of the ``rouge`` package (py-rouge); 0 where it raises.
- ``rouge_l_zh`` (``rouge_zh_score``): the same on the jieba words joined by spaces.
- ``classification`` (``classification_score``): 1/k when the reference is among the k class names
  found in the prediction (after LongBench's removal step, below), else 0. Needs ``all_classes``.
- ``retrieval_en`` (``retrieval_score``): the share of the numbers in the prediction equal to N in the
  reference's ``Paragraph N``.
- ``retrieval_zh`` (``retrieval_zh_score``): the same with ``段落N``.
- ``count`` (``count_score``): the share of the numbers in the prediction equal to the reference.
- ``code_sim`` (``code_sim_score``): fuzzywuzzy's ``fuzz.ratio`` / 100 between the reference and the
  prediction's first line that has no backtick, ``#`` or ``//``.
- ``exact_match`` (SQuAD's EM, not a LongBench metric): equality of the ``normalize_answer``-ed texts.
- ``tool_call`` (ours, for the synthetic tool workload): the prediction parses to the reference's
  ``{"name", "arguments"}`` call.

``LONGBENCH_METRICS`` maps each LongBench dataset, and each LongBench-E ``<name>_e`` one, to its metric
(LongBench's ``dataset2metric``; ``pred.py`` writes LongBench-E predictions under the plain name, so
``eval.py`` scores them with the plain name's metric). ``score(..., dataset=...)`` keeps only the first
line of the prediction for ``FIRST_LINE_DATASETS`` (trec, triviaqa, samsum, lsht), as LongBench's scorer
does.

LongBench's behaviour is reproduced where it is surprising, so that numbers compare:

- ``rouge_l`` counts *distinct* words: py-rouge's ROUGE-L is summary level over sentences split at ``.``,
  with the hit count, the reference length and the prediction length all taken as sets of words.
  Whitespace-only text is one sentence of one empty word, so two whitespace-only texts score
  ~1 (0.999999995, py-rouge's 1e-8 in the denominator), and a ``". "`` at the end adds an empty word.
  Empty text and text of only dots have no sentence; py-rouge raises and the score is 0 (LongBench
  catches every exception; we catch ``Exception``, which also turns py-rouge's ``RecursionError`` on a
  very long sentence into 0, as in LongBench).
- ``classification`` drops, from the class names found in the prediction, each one that is a proper
  substring of the reference, but LongBench removes them from the list it is iterating over, so the
  name right after each removed one is never checked. Its fallback to the most similar class (difflib)
  sits behind ``if em_match_list != 0``, which is always true, so it never runs: no class named scores 0.
- ``code_sim`` uses rapidfuzz's ``fuzz.ratio``, which equals fuzzywuzzy's ``ratio`` backed by
  python-Levenshtein (the Indel similarity ``2 * LCS / (len(a) + len(b))``), with fuzzywuzzy's rules
  kept: equal strings 100, one empty 0, else ``int(round(x))`` (Python's round-half-to-even: 12.5 -> 12,
  37.5 -> 38). fuzzywuzzy without python-Levenshtein falls back to difflib, whose ratio can differ.
- ``count`` and the retrieval metrics compare digit strings: "04" is not "4". A retrieval reference
  with no paragraph id raises ``ValueError`` (LongBench fails there with an ``IndexError``).

``jieba`` (the Chinese metrics) and ``rapidfuzz`` (``code_sim``) come with the ``eval`` extra and are
imported when first needed, as is ``rouge``.
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

from hypic_rag.chat.formats.bundled import parse_call

Pair = Callable[..., float]

_PUNCT = set(string.punctuation)
# normalize_zh_answer's punctuation: ASCII punctuation plus LongBench's list of CJK and full-width
# marks. The list is LongBench's as it stands, gaps included: it has 》 but not 《, and no full-width
# full stop (U+FF0E); the ASCII "." it ends with is already in string.punctuation.
_ZH_PUNCT = _PUNCT | set(
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏"
)

#: LongBench datasets whose prediction is cut to its first line before scoring.
FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lsht", "trec_e", "triviaqa_e", "samsum_e"})


# ---------------------------------------------------------------------------------------------------
# Normalisation and tokenisation


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation and the articles a/an/the, squash whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def normalize_zh_answer(text: str) -> str:
    """Lower-case, drop ASCII and Chinese punctuation, and remove all whitespace."""
    return "".join(ch for ch in text.lower() if ch not in _ZH_PUNCT and not ch.isspace())


_jieba = None


def _jieba_words(text: str) -> list[str]:
    """jieba's default (accurate, HMM on) segmentation, as LongBench calls it."""
    global _jieba
    if _jieba is None:
        import jieba

        jieba.setLogLevel(logging.WARNING)  # silence "Building prefix dict ..." on stderr
        _jieba = jieba
    return list(_jieba.cut(text, cut_all=False))


def _multiset_f1(pred: Sequence[str], ref: Sequence[str]) -> float:
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------------------------------
# Pair scorers: one prediction against one reference, in [0, 1]


def token_f1(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """QA F1 (LongBench ``qa_f1_score``): F1 of the token multisets of the normalised texts."""
    return _multiset_f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


def token_f1_zh(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """Chinese QA F1 (``qa_f1_zh_score``): F1 over jieba words, each normalised, empty ones dropped."""

    def words(text: str) -> list[str]:
        return [w for w in map(normalize_zh_answer, _jieba_words(text)) if w]

    return _multiset_f1(words(prediction), words(reference))


def exact(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """1 when the normalised texts are equal (SQuAD's EM)."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def call_match(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """1 when the prediction parses to the same ``{"name", "arguments"}`` call as the reference."""
    call = parse_call(prediction)
    return float(call is not None and call == parse_call(reference))


def rouge_l_f(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """ROUGE-L F of py-rouge (LongBench ``rouge_score``); 0 where py-rouge raises."""
    from rouge import Rouge

    # LongBench asks for py-rouge's default rouge-1/2/l and reads rouge-l; rouge-1/2 raise only where
    # rouge-l does (no sentence on either side), so computing rouge-l alone gives the same numbers.
    try:
        return Rouge(metrics=["rouge-l"]).get_scores([prediction], [reference], avg=True)["rouge-l"]["f"]
    except Exception:  # LongBench: a bare except returning 0.0
        return 0.0


def rouge_l_f_zh(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """ROUGE-L F on jieba words joined by spaces (LongBench ``rouge_zh_score``)."""
    return rouge_l_f(" ".join(_jieba_words(prediction)), " ".join(_jieba_words(reference)))


def class_match(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench ``classification_score``: 1/k when the reference is one of the k classes named.

    A class is named when its name is a substring of the prediction. Names that are a proper substring
    of the reference are then dropped, with LongBench's skip: it removes from the list while iterating
    over it, so the name after each removed one is kept unchecked. The walk below is that iteration.
    """
    if all_classes is None:
        raise ValueError("the classification metric needs all_classes")
    named = [c for c in all_classes if c in prediction]
    i = 0
    while i < len(named):
        name = named[i]
        if name in reference and name != reference:
            named.remove(name)  # the first equal entry, as list.remove does in LongBench
        i += 1
    return 1.0 / len(named) if reference in named else 0.0


def _share_equal(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return numbers.count(target) / len(numbers) if numbers else 0.0


def _paragraph(reference: str, pattern: str) -> str:
    found = re.findall(pattern, reference)
    if not found:
        raise ValueError(f"reference {reference!r} has no paragraph id matching {pattern!r}")
    return found[0]


def paragraph_id_en(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench ``retrieval_score``: share of the prediction's numbers equal to ``Paragraph N``'s N."""
    return _share_equal(prediction, _paragraph(reference, r"Paragraph (\d+)"))


def paragraph_id_zh(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench ``retrieval_zh_score``: the same with ``段落N``."""
    return _share_equal(prediction, _paragraph(reference, r"段落(\d+)"))


def count_match(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench ``count_score``: share of the prediction's numbers equal to the reference."""
    return _share_equal(prediction, str(reference))


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio``: 100 for equal strings, 0 if one is empty, else the rounded Indel ratio."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    from rapidfuzz import fuzz

    return int(round(fuzz.ratio(a, b)))


def code_line_similarity(prediction: str, reference: str, *, all_classes: Sequence[str] | None = None) -> float:
    """LongBench ``code_sim_score``: ``fuzz_ratio`` / 100 of the first code line of the prediction.

    The first line (after leading newlines) with no backtick, ``#`` or ``//``; the empty string when
    every line has one.
    """
    lines = prediction.lstrip("\n").split("\n")
    line = next((ln for ln in lines if "`" not in ln and "#" not in ln and "//" not in ln), "")
    return fuzz_ratio(line, reference) / 100


# ---------------------------------------------------------------------------------------------------
#: Pair scorers by metric name, each ``(prediction, reference, *, all_classes=None) -> [0, 1]``.
PAIR_METRICS: dict[str, Pair] = {
    "f1": token_f1,
    "f1_zh": token_f1_zh,
    "exact_match": exact,
    "tool_call": call_match,
    "rouge_l": rouge_l_f,
    "rouge_l_zh": rouge_l_f_zh,
    "classification": class_match,
    "retrieval_en": paragraph_id_en,
    "retrieval_zh": paragraph_id_zh,
    "count": count_match,
    "code_sim": code_line_similarity,
}


def _metric(name: str, pair: Pair) -> Callable[..., float]:
    """The metric of a pair scorer: its best score over the references, x 100."""

    def metric(prediction: str, references: Sequence[str], *, all_classes: Sequence[str] | None = None) -> float:
        return 100.0 * max((pair(prediction, r, all_classes=all_classes) for r in references), default=0.0)

    metric.__name__ = metric.__qualname__ = name
    metric.__doc__ = f"``{pair.__name__}``, best over the references, x 100."
    return metric


#: Metrics by name, each ``(prediction, references, *, all_classes=None) -> [0, 100]``.
METRICS: dict[str, Callable[..., float]] = {name: _metric(name, pair) for name, pair in PAIR_METRICS.items()}
f1, exact_match, tool_call, rouge_l = METRICS["f1"], METRICS["exact_match"], METRICS["tool_call"], METRICS["rouge_l"]

_LONGBENCH = {
    "narrativeqa": "f1",
    "qasper": "f1",
    "multifieldqa_en": "f1",
    "multifieldqa_zh": "f1_zh",
    "hotpotqa": "f1",
    "2wikimqa": "f1",
    "musique": "f1",
    "dureader": "rouge_l_zh",
    "gov_report": "rouge_l",
    "qmsum": "rouge_l",
    "multi_news": "rouge_l",
    "vcsum": "rouge_l_zh",
    "trec": "classification",
    "triviaqa": "f1",
    "samsum": "rouge_l",
    "lsht": "classification",
    "passage_retrieval_en": "retrieval_en",
    "passage_count": "count",
    "passage_retrieval_zh": "retrieval_zh",
    "lcc": "code_sim",
    "repobench-p": "code_sim",
}
_LONGBENCH_E = (
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
    "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
)  # fmt: skip

#: LongBench (and LongBench-E ``_e``) dataset -> metric name in ``METRICS``.
LONGBENCH_METRICS: dict[str, str] = {**_LONGBENCH, **{f"{name}_e": _LONGBENCH[name] for name in _LONGBENCH_E}}


def first_line(prediction: str) -> str:
    """The first line after any leading newlines, as LongBench cuts trec/triviaqa/samsum/lsht outputs."""
    return prediction.lstrip("\n").split("\n")[0]


def score(
    metric: str,
    prediction: str,
    references: Sequence[str],
    *,
    all_classes: Sequence[str] | None = None,
    dataset: str | None = None,
) -> float:
    """``metric``'s best score over ``references``, x 100; LongBench's first-line cut for ``dataset``."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if dataset in FIRST_LINE_DATASETS:
        prediction = first_line(prediction)
    return METRICS[metric](prediction, references, all_classes=all_classes)
