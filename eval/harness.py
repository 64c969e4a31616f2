"""``hypic-rag eval``: score a workload in several modes on one model, with fidelity against ``full``.

Each example's messages and tools go through ``Engine.chat`` in every mode, so the checkpoint's own
chat template makes the prompt and every mode gets the same segments and token ids (a conversation's earlier
turns are asked first, in the same mode, and each mode restores only the states it kept itself); the answer is
what the model writes up to its end of answer (a tool call as it wrote it), scored with the
workload's metric. For
modes other than ``full`` it also reports KL(full ‖ mode) and top-1 agreement of the first answer
token, and, with ``full`` among the modes, ``same_answer``: the share of answers identical to ``full``'s (the
score gap nets out answers that differ both ways, and rewards a mode that is luckily right where ``full`` is
wrong). The JSON (docs/benchmarks.md): ``{"workload", "n", "results": {mode: {"score", "metric", "kl",
"top1", "recomputed_tokens", ...}}, "gap_points": {mode: full - mode}}``; ``report.write_report`` turns it
into a table and plots. ``recomputed_tokens`` is the mean per request of the tokens run in context (seams,
segments too short to cache, the query; everything in ``full``), as a warm request runs them: the isolated
prefills that made a missing entry are ``filled_tokens`` beside it, and an ``auto`` seam's or a guarded
request's probes ``probe_tokens`` (the boundaries' probe runs the first layers only, ``auto``'s reading
probe every layer). ``probe_cost`` weights those by the share of the layers they went through, and
``cost_tokens`` is ``recomputed_tokens + probe_cost``: what a mode really computes per request, in tokens of
a whole forward (the column the seam comparisons read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypic_rag import Engine, GenerationOutput
from hypic_rag.chat.segmentation import flat_prompt
from hypic_rag.engine import MODES
from hypic_rag.fidelity import kl_divergence, top1_agreement
from hypic_rag.options import check_seam
from hypic_rag.segments import Segment

from .data.longbench import read_longbench_jsonl
from .data.workloads import SEGMENTATION, WORKLOADS, Example, make
from .intervals import paired_interval
from .metrics import score
from .progress import progress


def check_workload(workload: str) -> None:
    """A ``ValueError`` unless ``workload`` names a workload or an existing ``.jsonl`` file."""
    if workload in WORKLOADS:
        return
    path = Path(workload)
    if not (path.suffix == ".jsonl" and path.is_file()):
        raise ValueError(
            f"--workload must be one of {', '.join(WORKLOADS)} or an existing .jsonl file, not {workload!r}"
        )


def load_examples(workload: str, n: int, seed: int) -> tuple[str, list[Example]]:
    """A named workload, or a LongBench-schema JSONL file (its first ``n`` rows)."""
    check_workload(workload)
    if workload in WORKLOADS:
        return workload, make(workload, n, seed)
    return Path(workload).stem, read_longbench_jsonl(Path(workload))[:n]


Seam = int | float | str


def seam_label(seam: Seam) -> str:
    """``hypic@w8``, ``hypic@w0.25``, ``hypic@auto``, ``hypic@auto:9.6``, ``hypic@blend:8``."""
    return f"hypic@{seam}" if isinstance(seam, str) else f"hypic@w{seam:g}"


def seam_options(seam: Seam) -> dict[str, Any]:
    """The request options of a swept seam: ``auto:B`` is ``seam="auto"`` with ``seam_budget=B`` tokens per
    boundary, ``blend:B`` the CacheBlend-style baseline (``seam="blend"``) under that budget."""
    kind, colon, budget = seam.partition(":") if isinstance(seam, str) else ("", "", "")
    if colon and kind in ("auto", "blend"):
        try:
            return {"seam": kind, "seam_budget": float(budget)}
        except ValueError:
            raise ValueError(f"{kind}:BUDGET takes a number of tokens per boundary, got {seam!r}") from None
    check_seam(seam)
    return {"seam": seam}


def mode_labels(modes: Sequence[str], seams: Sequence[Seam]) -> list[str]:
    """The labels a run of ``modes`` and swept ``seams`` reports its results under."""
    return [label for label, _, _ in _variants(modes, seams)]


def _variants(modes: Sequence[str], seams: Sequence[Seam]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, mode, options): each mode at the engine's seam, plus ``hypic@wN`` (or ``hypic@auto``,
    ``hypic@auto:B``) for each swept seam."""
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must come from {', '.join(MODES)}; got {list(modes)}")
    out: list[tuple[str, str, dict[str, Any]]] = [(m, m, {}) for m in modes]
    return out + [(seam_label(w), "hypic", seam_options(w)) for w in seams]


def served_prompt(engine: Engine, ex: Example) -> list[dict[str, Any]] | tuple[list[Segment], Segment]:
    """``ex``'s prompt as served, so a framework's prompt is scored as it reaches the model: its messages as the
    integrations and the server hand them to this engine (its chat format's ``prepare_messages``), or a
    completions-route example's flat prompt as that route cuts it (``flat_prompt``: segments and query)."""
    if "completion" in ex.meta:
        return flat_prompt(ex.meta["completion"])
    return engine.chat_format.prepare_messages(ex.messages, SEGMENTATION)


def _answer(
    engine: Engine,
    ex: Example,
    served: list[dict[str, Any]] | tuple[list[Segment], Segment],
    mode: str,
    options: dict[str, Any],
    max_new_tokens: int,
) -> GenerationOutput:
    """One greedy answer to ``ex`` in ``mode``: a chat request, or the completions route's flat prompt."""
    sampling = {"mode": mode, **options, "temperature": 0.0, "max_new_tokens": max_new_tokens}
    if isinstance(served, tuple):
        return engine.generate(*served, **sampling)
    return engine.chat(served, tools=ex.tools, segmentation=SEGMENTATION, **sampling)


def _earlier_turns(engine: Engine, ex: Example, mode: str, options: dict[str, Any], max_new_tokens: int) -> None:
    """Each mode answers an example with only the states it kept itself: the kept states are cleared first (a
    composed mode would otherwise restore ``prefix``'s exact ones). Then a conversation's earlier turns are asked
    in ``mode``, as a live conversation asks them, so the last turn continues the states they kept (its history
    holds the example's own answers; the segment entries they fill stay, as a server's would)."""
    engine.prefix_store.clear()
    if mode == "full":
        return
    for k in ex.meta.get("turns", ()):
        earlier = replace(ex, messages=ex.messages[:k])
        _answer(engine, earlier, served_prompt(engine, earlier), mode, options, max_new_tokens)


def prediction(engine: Engine, out: GenerationOutput) -> str:
    """The answer to score: ``out.text``, or where the model wrote a tool call, the call as it wrote it (the
    tool-call metric parses it; exact match and ROUGE read what the model wrote)."""
    return engine.decode(out.token_ids).strip() if out.tool_calls else (out.text or "").strip()


def evaluate(
    engine: Engine,
    workload: str,
    modes: Sequence[str],
    n: int = 100,
    seed: int = 0,
    max_new_tokens: int = 48,
    log: Callable[[str], None] = print,
    seams: Sequence[Seam] = (),
) -> dict[str, Any]:
    variants = _variants(modes, seams)
    if engine.tokenizer is None or engine.chat_setup is None:
        raise ValueError(
            f"evaluation needs a checkpoint with a tokenizer and a chat template; {engine.name!r} lacks one"
        )
    name, examples = load_examples(workload, n, seed)
    labels = [v[0] for v in variants]
    scores: dict[str, list[float]] = {m: [] for m in labels}
    extra: dict[str, dict[str, list[float]]] = {m: {k: [] for k in SECONDARY} for m in labels}
    kls: dict[str, list[float]] = {m: [] for m in labels if m != "full"}
    agree: dict[str, list[bool]] = {m: [] for m in labels if m != "full"}
    same: dict[str, list[bool]] = {m: [] for m in labels if m != "full"}
    tokens: dict[str, dict[str, list[float]]] = {m: {k: [] for k in TOKENS} for m in labels}
    bar = progress(len(examples) * len(variants), f"{name} x {len(variants)} modes", "ex")
    for ex in examples:
        served = served_prompt(engine, ex)
        outputs = {}
        for label, mode, options in variants:
            _earlier_turns(engine, ex, mode, options, max_new_tokens)
            outputs[label] = _answer(engine, ex, served, mode, options, max_new_tokens)
        full = outputs["full"].prompt_logits if "full" in outputs else None
        if full is None and kls:
            if isinstance(served, list):
                rendered = engine.render(served, ex.tools, segmentation=SEGMENTATION)
                served = (rendered.segments, rendered.query)
            full = engine.prompt_logits(*served, mode="full")
        answers = {label: prediction(engine, out) for label, out in outputs.items()}
        for label, out in outputs.items():
            answer = answers[label]
            if label != "full" and "full" in answers:
                same[label].append(answer == answers["full"])
            classes = ex.meta.get("all_classes")
            scores[label].append(score(ex.metric, answer, ex.answers, all_classes=classes, dataset=ex.workload))
            for key in SECONDARY:
                extra[label][key].append(score(key, answer, ex.answers))
            stats = out.stats
            tokens[label]["recomputed_tokens"].append(stats["recomputed_tokens"] - stats.get("filled_tokens", 0))
            tokens[label]["filled_tokens"].append(stats.get("filled_tokens", 0))
            tokens[label]["probe_tokens"].append(stats.get("probe_tokens", 0))
            counts = tokens[label]
            counts["probe_cost"].append(stats.get("probe_cost", 0.0))
            counts["cost_tokens"].append(counts["recomputed_tokens"][-1] + counts["probe_cost"][-1])
            if label != "full":
                kls[label].append(kl_divergence(full, out.prompt_logits))
                agree[label].append(top1_agreement(full, out.prompt_logits))
            bar.update(1)
    bar.close()
    metric = examples[0].metric if examples else "f1"
    results: dict[str, dict[str, Any]] = {}
    for label in labels:
        row: dict[str, Any] = {"score": _mean(scores[label]), "metric": metric}
        row.update({key: _mean(values) for key, values in extra[label].items()})
        row.update({key: _mean(values) for key, values in tokens[label].items()})
        if label in kls:
            row["kl"] = _mean(kls[label])
            row["top1"] = _mean(agree[label])
        if same.get(label):
            row["same_answer"] = _mean(same[label])
        if label != "full" and "full" in scores and len(examples) > 1:
            row["gap_interval"] = list(paired_interval(scores["full"], scores[label])[1:])
        results[label] = row
        log(
            f"  {label:<10} {metric} {row['score']:6.1f}"
            + (f"  KL {row['kl']:.2e}  top-1 {row['top1']:.2f}" if "kl" in row else "")
            + (f"  same answer {row['same_answer']:.3f}" if "same_answer" in row else "")
            + f"  recomputed {row['recomputed_tokens']:.1f}  with probe {row['cost_tokens']:.1f}"
        )
    report: dict[str, Any] = {"workload": name, "n": len(examples), "seed": seed, "results": results}
    if "full" in results:
        report["gap_points"] = {m: results["full"]["score"] - r["score"] for m, r in results.items() if m != "full"}
    # each example's score and KL, so any two modes can be compared afterwards (``eval/intervals.compare``)
    report["per_example"] = {m: {"score": scores[m], **({"kl": kls[m]} if m in kls else {})} for m in labels}
    return report


SECONDARY = ("exact_match", "rouge_l")
TOKENS = ("recomputed_tokens", "filled_tokens", "probe_tokens", "probe_cost", "cost_tokens")  # per request, means


def _mean(values: Sequence[float]) -> float:
    return sum(values) / max(1, len(values))


def evaluate_many(
    engine: Engine,
    workloads: Sequence[str],
    modes: Sequence[str],
    n: int = 100,
    seed: int = 0,
    max_new_tokens: int = 48,
    log: Callable[[str], None] = print,
    seams: Sequence[Seam] = (),
) -> dict[str, Any]:
    """Each workload's report, and each mode's score and gap averaged over the workloads."""
    reports = []
    for workload in workloads:
        log(f"{workload}: n={n}, seed={seed}")
        reports.append(evaluate(engine, workload, modes, n, seed, max_new_tokens, log, seams))
    labels = list(reports[0]["results"])
    out: dict[str, Any] = {
        "workloads": reports,
        "mean_score": {m: _mean([r["results"][m]["score"] for r in reports]) for m in labels},
        "mean_recomputed_tokens": {m: _mean([r["results"][m]["recomputed_tokens"] for r in reports]) for m in labels},
        "mean_cost_tokens": {m: _mean([r["results"][m]["cost_tokens"] for r in reports]) for m in labels},
    }
    if "full" in labels:
        out["mean_kl"] = {m: _mean([r["results"][m]["kl"] for r in reports]) for m in labels if m != "full"}
    if "full" in labels:
        out["mean_gap_points"] = {m: _mean([r["gap_points"][m] for r in reports]) for m in labels if m != "full"}
        out["mean_same_answer"] = {
            m: _mean([r["results"][m]["same_answer"] for r in reports if "same_answer" in r["results"][m]])
            for m in labels
            if m != "full"
        }
    return out
