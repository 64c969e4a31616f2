"""Decode throughput by batch size: one forward for every running request (``HybridModel.decode_batch``) against
the same requests decoded one at a time.

    python -m hypic_rag.eval.bench.batching --json bench-batching.json

A random ``qwen3_5_text`` model on Qwen3.5-0.8B layer shapes (``layers`` decoder layers, three linear to one full,
the 248k-token LM head whole), ``batch`` requests each prefilled with its own ``prompt_tokens``-token prompt, then
``steps`` decode steps of all of them together; tokens/s is ``batch * steps`` over the best of ``repeats`` timed
rounds. Batch 1 is also timed through the single-request path (``model(token, state)``), the serial baseline.
Every batch size runs in the same process, in turn within each round, so the ratios are side by side.

``--clock cpu`` times the calling thread's CPU seconds instead of wall seconds (one torch thread only): on a
machine shared with other work, time spent waiting for a core is then not counted against either side.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .common import layer_shapes, random_model, write_report

BATCHES = (1, 2, 4, 8, 16, 32)


def _prefilled(model: Any, batch: int, prompt_tokens: int, seed: int) -> tuple[list[Any], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    states, tokens = [], []
    for _ in range(batch):
        state = model.new_state()
        ids = torch.randint(3, model.config.vocab_size, (1, prompt_tokens), generator=gen).to(model.device)
        tokens.append(int(model(ids, state=state, logits_to_keep=1)[0, -1].argmax()))
        states.append(state)
    return states, tokens


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _seconds(
    model: Any, states: list[Any], tokens: list[int], steps: int, serial: bool, clock: Callable[[], float]
) -> tuple[float, list[int]]:
    """Seconds for ``steps`` decode steps of these requests (``serial``: a forward each), and their next tokens."""
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    start = clock()
    for _ in range(steps):
        if serial:
            pairs = zip(tokens, states, strict=True)
            tokens = [int(model(torch.tensor([[t]], device=model.device), state=s)[0, -1].argmax()) for t, s in pairs]
        else:
            tokens = model.decode_batch(tokens, states).argmax(-1).tolist()
    sync()
    return clock() - start, tokens


def run(
    layers: Sequence[int] = (2, 4),
    batches: Sequence[int] = BATCHES,
    prompt_tokens: int = 64,
    steps: int = 4,
    repeats: int = 3,
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
    clock: str = "wall",
    **load: Any,
) -> dict[str, Any]:
    """Each round times every batch size once, in turn (this shared machine's speed drifts: rounds spread it over
    all of them), and each size keeps its best round. The requests are prefilled once; a batch of ``b`` decodes
    the first ``b`` of them, which go on from wherever the rounds before left them. ``load``: the model's device
    and dtype (default CPU, fp32)."""
    if min(*layers, *batches, prompt_tokens, steps, repeats) < 1:
        raise ValueError("layers, batches, prompt_tokens, steps and repeats must be >= 1")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and (torch.get_num_threads() != 1 or torch.device(load.get("device", "cpu")).type != "cpu"):
        raise ValueError("clock='cpu' counts one thread's time: run on CPU with one torch thread (OMP_NUM_THREADS=1)")
    report: dict[str, Any] = {
        "benchmark": "batching",
        "prompt_tokens": prompt_tokens,
        "steps": steps,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "clock": clock,
        "layers": {},
    }
    for n in layers:
        model = random_model(layer_shapes(n, shapes), **load)
        best: dict[str, float] = {}
        with torch.inference_mode():
            states, tokens = _prefilled(model, max(batches), prompt_tokens, seed=n)
            for _ in range(repeats):
                for b in ["alone", *batches]:
                    size = 1 if b == "alone" else int(b)
                    t, tokens[:size] = _seconds(model, states[:size], tokens[:size], steps, b == "alone", CLOCKS[clock])
                    best[str(b)] = min(best.get(str(b), float("inf")), t / (size * steps))
        alone = 1 / best["alone"]
        rows = {str(b): {"tokens_per_s": 1 / best[str(b)], "over_alone": best["alone"] / best[str(b)]} for b in batches}
        log(f"{n} layers: batch 1 alone (the single-request path) {alone:.2f} tokens/s")
        for b, row in rows.items():
            log(f"  batch {b:>2}: {row['tokens_per_s']:8.2f} tokens/s, {row['over_alone']:5.2f}x alone")
        report["layers"][str(n)] = {"alone_tokens_per_s": alone, "batches": rows}
        del model, states
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=list(BATCHES))
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over every batch size; each keeps its best")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: one thread's CPU seconds")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.layers, args.batches, args.prompt_tokens, args.steps, args.repeats, clock=args.clock)
    if args.json:
        write_report(report, args.json, "batching")


if __name__ == "__main__":
    main()
