"""``hypic-rag bench --bundled``: TTFT of each mode on the bundled model, with its defaults, on the demo's kind
of prompt.

Prompts are the demo corpus's documents as a retriever hands them over (``k`` per prompt, as
``hypic``-kind parts of one user message through the model's own chat template) and a question about
one of them; warm means the same documents were sent earlier in another order. Two sizes of document:
``fact`` (one sentence, one fact: the corpus as the demo and the integrations chunk it) and
``profile`` (a person's four facts in one document of a few sentences); ``prefix`` gets the warm order's
prefixes afresh before each timed prompt, so it never sees a repeat. Each round times every mode
on every prompt, interleaved, so slow stretches of a shared machine hit all modes alike; the figure is
the median over rounds and prompts, and the speedup is ``full``'s median over each mode's.

On a model this small a forward costs about as much per operation as per token, so what decides the
race is how many operations each mode runs, not how many tokens: this measures exactly that.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.options import MODES

from ..data.corpus import corpus
from ..progress import progress
from .common import speedup

SIZES = ("fact", "profile")


def _documents(size: str, people: int, seed: int) -> tuple[list[str], list[tuple[int, str]]]:
    """The documents and each question with the document that answers it."""
    texts, qa = corpus(people, seed, profiles=size == "profile")
    per_doc = len(qa) // len(texts)  # questions per document: 1 for facts, a person's 4 for profiles
    return texts, [(i // per_doc, q) for i, (q, _) in enumerate(qa)]


def _messages(docs: Sequence[str], question: str) -> list[dict[str, Any]]:
    parts = [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in docs]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


def run(
    sizes: Sequence[str] = SIZES,
    docs_per_prompt: int = 6,
    prompts: int = 6,
    rounds: int = 20,
    modes: Sequence[str] = ("full", "prefix", "hypic"),
    seed: int = 0,
    engine: Engine | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    if "full" not in modes or any(m not in MODES for m in modes) or any(s not in SIZES for s in sizes):
        raise ValueError(
            f"modes come from {', '.join(MODES)} and include full (got {', '.join(modes)}); "
            f"sizes come from {', '.join(SIZES)}"
        )
    if min(docs_per_prompt, prompts, rounds) < 1:
        raise ValueError("docs_per_prompt, prompts and rounds must be >= 1")
    engine = engine or Engine.from_pretrained()
    log(f"bundled model, default options; {prompts} prompts x {docs_per_prompt} documents, {rounds} rounds")
    results = []
    warming = sum(m not in ("full", "prefix") for m in modes)
    bar = progress(len(sizes) * prompts * (warming + rounds * len(modes)), "bench --bundled", "prompt")
    for size in sizes:
        texts, questions = _documents(size, 24, seed)
        rng = random.Random(f"bench-bundled:{seed}:{size}")
        cases = []
        for _ in range(prompts):
            picked = rng.sample(range(len(texts)), docs_per_prompt)
            question = rng.choice([q for i, q in questions if i in picked])
            docs = [texts[i] for i in picked]
            cases.append((_messages(docs, question), _messages(docs[::-1], question)))
        engine.clear_cache()
        times: dict[str, list[float]] = {m: [] for m in modes}
        stats: dict[str, dict[str, Any]] = {}
        for mode in (m for m in modes if m not in ("full", "prefix")):
            for _, warm in cases:  # every document cached, in another order (prefix warms before each prompt)
                engine.chat(warm, mode=mode, max_new_tokens=1)
                bar.update(1)
        for _ in range(rounds):
            for messages, warm in cases:
                for mode in modes:
                    if mode == "prefix":  # the timed prompt is never a repeat: only the warm order's prefixes
                        engine.prefix_store.clear()
                        engine.chat(warm, mode=mode, max_new_tokens=1)
                    out = engine.chat(messages, mode=mode, max_new_tokens=1)
                    times[mode].append(out.ttft_s)
                    stats[mode] = out.stats
                    bar.update(1)
        medians = {m: statistics.median(t) for m, t in times.items()}
        tokens = engine.render(cases[0][0]).segments
        row = {
            "size": size,
            "segment_tokens": [len(engine.encode(s.text or "")) for s in tokens],
            "ttft_s": medians,
            "speedup": speedup(medians),
            "hit_segments": {m: (s["hit_segments"], s["hit_segments"] + s["miss_segments"]) for m, s in stats.items()},
            "recomputed_tokens": {m: s["recomputed_tokens"] for m, s in stats.items()},
            "prompt_tokens": stats["full"]["prompt_tokens"],
        }
        results.append(row)
        log(f"  {size}: {row['prompt_tokens']} prompt tokens, " + ", ".join(
            f"{m} {medians[m] * 1e3:.2f} ms" for m in modes) + "; speedup over full: " + ", ".join(
            f"{m} {v:.2f}x" for m, v in row["speedup"].items()))  # fmt: skip
    bar.close()
    return {"benchmark": "bundled", "threads": torch.get_num_threads(), "rounds": rounds, "results": results}
