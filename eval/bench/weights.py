"""``hypic-rag bench weights``: how far decoding from 8-bit or bfloat16 weights (``Engine.from_pretrained(weights=
"int8")``, ``"bfloat16"``) drifts from float32, on the bundled eval's prompts.

For each workload's examples, the float32 engine answers greedily; both engines then read the same prompt (in
float32, as both leave prompts) and are fed that answer token by token through decode steps, and each step's
next-token distributions are compared: KL(float32 ‖ other) in nats and whether their top tokens agree. Teacher
forcing keeps the two on the same tokens, so every step is compared, not only those before a first disagreement.
The eval scores of each format (``hypic-rag eval --weights ...``) are the other half of the check.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.defaults import WEIGHTS
from hypic_rag.fidelity import kl_divergence, top1_agreement

from ..data.workloads import WORKLOADS, make
from .common import write_report

COMPARED = tuple(w for w in WEIGHTS if w != "float32")  # each against float32
DEFAULT_WORKLOADS = ("single_doc", "multi_hop", "aggregate", "tool_call", "memory", "framework_qa")


def decode_drift(
    reference: Engine, other: Engine, prompt: Sequence[int], answer: Sequence[int]
) -> list[tuple[float, bool]]:
    """(KL, top-1 agreement) of each decode step after ``prompt`` as ``answer`` is fed to both engines' models."""
    out = []
    with torch.inference_mode():
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        states = [reference.model.new_state(), other.model.new_state()]
        for engine, state in zip((reference, other), states, strict=True):
            engine.model(ids, state=state, logits_to_keep=1)
        for token in answer[:-1]:
            ref = reference.model.decode_batch([token], [states[0]])[0]
            got = other.model.decode_batch([token], [states[1]])[0]
            out.append((kl_divergence(ref, got), top1_agreement(ref, got)))
    return out


def run(
    workloads: Sequence[str] = DEFAULT_WORKLOADS,
    n: int = 20,
    seed: int = 0,
    max_new_tokens: int = 32,
    model: str | None = None,
    log: Callable[[str], None] = print,
    weights: str = "int8",
) -> dict[str, Any]:
    if n < 1 or any(w not in WORKLOADS for w in workloads):
        raise ValueError(f"n must be >= 1 and the workloads from {', '.join(WORKLOADS)}")
    if weights not in COMPARED:
        raise ValueError(f"weights must be {' or '.join(COMPARED)} (compared with float32), got {weights!r}")
    reference = Engine.from_pretrained(model)
    other = Engine.from_pretrained(model, weights=weights)
    if not (other.model.decodes_int8 or other.model.decodes_bf16):
        raise ValueError(f"this CPU decodes weights={weights!r} from float32: nothing to compare")
    rows = []
    for workload in workloads:
        steps: list[tuple[float, bool]] = []
        for example in make(workload, n, seed):
            prepared = reference.prepare_chat(example.messages, tools=example.tools)
            answer = reference.chat(example.messages, tools=example.tools, mode="full", max_new_tokens=max_new_tokens)
            steps += decode_drift(reference, other, prepared.prompt.ids, answer.token_ids)
        kls = [kl for kl, _ in steps]
        row = {
            "workload": workload,
            "steps": len(steps),
            "kl_mean": statistics.fmean(kls) if kls else 0.0,
            "kl_p95": sorted(kls)[int(0.95 * (len(kls) - 1))] if kls else 0.0,
            "kl_max": max(kls, default=0.0),
            "top1_agreement": statistics.fmean(float(agree) for _, agree in steps) if steps else 1.0,
        }
        rows.append(row)
        log(
            f"{workload}: {row['steps']} decode steps, KL mean {row['kl_mean']:.2e} p95 {row['kl_p95']:.2e} "
            f"max {row['kl_max']:.2e}, top-1 agreement {row['top1_agreement']:.3f}"
        )
    every = [r for r in rows if r["steps"]]
    overall = sum(r["kl_mean"] * r["steps"] for r in every) / max(1, sum(r["steps"] for r in every))
    log(f"all: KL mean {overall:.2e} nats a decode step")
    return {"benchmark": "weights", "weights": weights, "n": n, "seed": seed, "results": rows, "kl_mean": overall}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hypic-rag bench weights", description=__doc__)
    parser.add_argument(
        "--workloads", default=",".join(DEFAULT_WORKLOADS), help="comma-separated (default: %(default)s)"
    )
    parser.add_argument("--n", type=int, default=20, help="examples of each workload (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="draws the examples (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="the float32 answer's length (default: %(default)s)"
    )
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the bundled model)")
    parser.add_argument(
        "--weights", choices=COMPARED, default="int8", help="compared with float32 (default: %(default)s)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    try:
        report = run(
            args.workloads.split(","), args.n, args.seed, args.max_new_tokens, args.model, weights=args.weights
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        write_report(report, args.json, "weights")


if __name__ == "__main__":
    main()
