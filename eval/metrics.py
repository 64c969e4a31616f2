"""Answer metrics, implemented from their definitions (LongBench's QA scoring and SQuAD's EM).

- ``normalize_answer``: lower-case, drop punctuation and the articles a/an/the, squash whitespace.
- ``f1``: token-multiset F1 of the normalised answers, the best over the references, x 100.
- ``exact_match``: normalised equality, the best over the references, x 100.
- ``tool_call``: 100 when the output parses to the same ``{"name", "arguments"}`` call as a reference.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Sequence

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


def parse_call(text: str) -> dict | None:
    """The first JSON object in ``text`` as ``{"name": str, "arguments": dict}``, or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        call, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return None
    if (
        not isinstance(call, dict)
        or not isinstance(call.get("name"), str)
        or not isinstance(call.get("arguments"), dict)
    ):
        return None
    return {"name": call["name"], "arguments": call["arguments"]}


def tool_call(prediction: str, references: Sequence[str]) -> float:
    call = parse_call(prediction)
    return 100.0 * any(call is not None and call == parse_call(r) for r in references)


METRICS = {"f1": f1, "exact_match": exact_match, "tool_call": tool_call}


def score(metric: str, prediction: str, references: Sequence[str]) -> float:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return METRICS[metric](prediction, references)
