"""Where a warm ``hypic`` request's time goes, on one thread, in one run.

    python -m hypic_rag.eval.bench.profile --json profile.json

The standard case of ``hypic-rag bench`` (a random checkpoint with Qwen3.5-0.8B layer shapes, 4 layers;
8 documents x 1,024 tokens + a 64-token query, warm: every document cached by an earlier request in
another order). The time inside the model's forwards is split by what they run: the forwards before
the last one (seams and in-context stretches), the last forward (the query, or everything at once
where the engine fuses them), and the LM head; the rest (lookup, composing states, placing KV, Python)
is what remains of the TTFT. Best of ``--repeats``; shares of that run's TTFT. It also times
``--decode`` greedy steps after a warm ``hypic`` prefill and after a ``full`` one, taking turns.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag.model import HybridModel

from .common import RandomSegments, random_engine, reordered, write_report


class _Timer:
    """Wall time of every ``hidden_states`` call and of the LM head, while armed."""

    def __init__(self, model: HybridModel) -> None:
        self.model = model
        self.forwards: list[tuple[int, float]] = []
        self.head = 0.0
        self._inner = model.hidden_states
        self._start = 0.0
        model.hidden_states = self._hidden_states  # type: ignore[method-assign]
        model.lm_head.register_forward_pre_hook(self._head_start)
        model.lm_head.register_forward_hook(self._head_end)

    def _hidden_states(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = self._inner(input_ids, *args, **kwargs)
        self.forwards.append((input_ids.shape[1], time.perf_counter() - start))
        return out

    def _head_start(self, *_: Any) -> None:
        self._start = time.perf_counter()

    def _head_end(self, *_: Any) -> None:
        self.head += time.perf_counter() - self._start

    def reset(self) -> None:
        self.forwards, self.head = [], 0.0


def _decode_rates(engine: Any, docs: list, query: Any, steps: int, repeats: int) -> dict[str, float]:
    """Greedy decode steps per second after each mode's prefill (the prompt warm for ``hypic``): the modes
    take turns, ``2 * repeats`` rounds, and each gets its median, so a slow stretch of a shared machine
    does not land on one mode only."""
    from hypic_rag.decoding import Decoder, step_together
    from hypic_rag.logits import Sampler

    seconds: dict[str, list[float]] = {"full": [], "hypic": []}
    for _ in range(2 * repeats):
        for mode, times in seconds.items():
            logits, state = engine.prefill(docs, query, mode=mode)
            sampler = Sampler()
            start = time.perf_counter()
            decoder = Decoder(
                engine.model, state, sampler.pick(logits, None), sampler, None, stops=(), max_new_tokens=steps
            )
            while not step_together([decoder])[0]:
                pass
            times.append(time.perf_counter() - start)
    return {mode: steps / statistics.median(times) for mode, times in seconds.items()}


def run(
    segments: int = 8,
    segment_tokens: int = 1024,
    query_tokens: int = 64,
    layers: int = 4,
    repeats: int = 2,
    shapes: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    decode: int = 16,
) -> dict[str, Any]:
    torch.set_num_threads(1)
    engine, _, vocab = random_engine(layers, shapes, log)
    prompts = RandomSegments(vocab)
    docs = prompts.segments(segments, segment_tokens)
    query = prompts.segments(1, query_tokens, "query")[0]
    timer = _Timer(engine.model)
    best: dict[str, Any] | None = None
    for _ in range(repeats):
        engine.clear_cache()
        engine.generate(reordered(docs), query, mode="hypic", max_new_tokens=1)
        timer.reset()
        out = engine.generate(docs, query, mode="hypic", max_new_tokens=1)
        forwards = list(timer.forwards)
        head = timer.head
        if best is None or out.ttft_s < best["ttft_s"]:
            before = forwards[:-1]
            best = {
                "ttft_s": out.ttft_s,
                "forwards": len(forwards),
                "tokens_per_forward": [n for n, _ in forwards],
                "parts_s": {
                    "earlier forwards (seams, stretches)": sum(t for _, t in before),
                    "last forward": forwards[-1][1],  # hidden_states: the LM head runs after it
                    "LM head": head,
                },
                "stats": out.stats,
            }
    assert best is not None
    best["parts_s"]["lookup, compose, KV, Python"] = best["ttft_s"] - sum(best["parts_s"].values())
    if decode:
        best["decode_tokens_per_s"] = _decode_rates(engine, docs, query, decode, repeats)
        rates = best["decode_tokens_per_s"]
        log("decode after the prefill: " + ", ".join(f"{m} {r:.1f} tok/s" for m, r in rates.items()))
    best["shares"] = {k: v / best["ttft_s"] for k, v in best["parts_s"].items()}
    log(f"warm hypic TTFT {best['ttft_s'] * 1e3:.0f} ms in {best['forwards']} forwards:")
    for part, seconds in best["parts_s"].items():
        log(f"  {part:<36} {seconds * 1e3:8.1f} ms  {100 * seconds / best['ttft_s']:5.1f}%")
    return {"benchmark": "profile", "layers": layers, "threads": 1, **best}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--segment-tokens", type=int, default=1024)
    parser.add_argument("--query-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decode", type=int, default=16, help="decode steps timed after each prefill (0: none)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.segments, args.segment_tokens, args.query_tokens, args.layers, args.repeats, decode=args.decode)
    if args.json:
        write_report(report, args.json, "profile")


if __name__ == "__main__":
    main()
