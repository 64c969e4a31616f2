"""Answer metrics, implemented from their definitions (LongBench's QA scoring and SQuAD's EM).

- ``normalize_answer``: lower-case, drop punctuation and the articles a/an/the, squash whitespace.
- ``f1``: token-multiset F1 of the normalised answers, the best over the references, x 100.
- ``exact_match``: normalised equality, the best over the references, x 100.
- ``rouge_l``: ROUGE-L F with the ``rouge`` package, as LongBench scores summaries, x 100.
- ``tool_call``: 100 when the output parses to the same ``{"name", "arguments"}`` call as a reference.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from hypic_rag.prompt_format import parse_call

_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, references: Sequence[str]) -> float:
    return 100.0 * max((_token_f1(prediction, r) for r in references), default=0.0)


def exact_match(prediction: str, references: Sequence[str]) -> float:
    return 100.0 * max((normalize_answer(prediction) == normalize_answer(r) for r in references), default=False)


def tool_call(prediction: str, references: Sequence[str]) -> float:
    call = parse_call(prediction)
    return 100.0 * any(call is not None and call == parse_call(r) for r in references)


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-L F as LongBench computes it: the ``rouge`` package (py-rouge), 0 on an empty prediction."""
    from rouge import Rouge

    best = 0.0
    for ref in references:
        if not prediction.strip() or not ref.strip():
            continue
        try:
            best = max(best, Rouge().get_scores([prediction], [ref], avg=True)["rouge-l"]["f"])
        except (ValueError, RecursionError):  # py-rouge raises on hypotheses with no words
            continue
    return 100.0 * best


METRICS = {"f1": f1, "exact_match": exact_match, "tool_call": tool_call, "rouge_l": rouge_l}


def score(metric: str, prediction: str, references: Sequence[str]) -> float:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return METRICS[metric](prediction, references)
