"""LongBench's JSONL schema (``input, context, answers, length, dataset, _id``) for the workloads' examples.

A file written here is one LongBench-style dataset: ``context`` holds an example's pieces as plain text,
blank-line separated. ``hypic-rag eval --workload FILE.jsonl`` reads one back as messages, each passage of
``context`` a document part and ``input`` the question, so the checkpoint's chat template makes the prompt
as for the workloads. A row is scored
with its dataset's metric: LongBench's own for LongBench's dataset names (``eval.metrics``), the
workload's for ours, F1 otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..metrics import LONGBENCH_METRICS
from .workloads import WORKLOAD_METRICS, Example, ask, part

PASSAGE_SEPARATOR = "\n\n"


def passages(ex: Example) -> list[str]:
    """An example's pieces as plain text, in prompt order: tool schemas and tool calls as JSON, the tagged
    parts' texts and tool results as they are."""
    out = [json.dumps(tool) for tool in ex.tools or []]
    for message in ex.messages:
        content = message.get("content")
        if isinstance(content, list):
            out += [p["text"] for p in content if "hypic" in p]
        elif message["role"] == "tool" and isinstance(content, str):
            out.append(content)
        out += [json.dumps(call["function"]) for call in message.get("tool_calls") or []]
    return out


def write_longbench_jsonl(examples: Iterable[Example], path: str | Path) -> int:
    """Write examples in LongBench's schema (``input, context, answers, length, dataset, _id``)."""
    count = 0
    with Path(path).open("w") as f:
        for ex in examples:
            context = PASSAGE_SEPARATOR.join(passages(ex))
            row = {
                "input": ex.query,
                "context": context,
                "answers": ex.answers,
                "length": len(context.split()),
                "dataset": ex.workload,
                "all_classes": None,
                "_id": ex.meta.get("id", str(count)),
            }
            f.write(json.dumps(row) + "\n")
            count += 1
    return count


def read_longbench_jsonl(path: str | Path) -> list[Example]:
    """Read LongBench-schema JSONL as examples: one user message with each passage of ``context`` (blank-line
    separated, stripped) a document part, then ``input`` as the question."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            docs = [part("document", p.strip()) for p in row["context"].split(PASSAGE_SEPARATOR) if p.strip()]
            answers = [str(a) for a in row["answers"]]
            query = str(row["input"])
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}:{lineno} is not a LongBench-schema row: {exc}") from exc
        dataset = str(row.get("dataset", ""))
        metric = LONGBENCH_METRICS.get(dataset) or WORKLOAD_METRICS.get(dataset, "f1")
        classes = row.get("all_classes")
        if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
            raise ValueError(f"{path}:{lineno}: all_classes must be a list of strings or null")
        if metric == "classification" and not classes:
            raise ValueError(f"{path}:{lineno}: dataset {dataset!r} is scored by class and needs all_classes")
        meta = {"id": str(row.get("_id", lineno)), "all_classes": classes}
        out.append(Example([ask(docs, query)], answers, metric, workload=dataset, meta=meta))
    return out
