"""CPU benchmark of operator capture against the plain delta rule, the cold path's extra cost:

    python -m hypic_rag.eval.bench.capture [--baseline REV] [--threads 1] [--repeats 3] [--json out.json]

Capture is the cold isolated prefill's linear-layer pass: ``split_transition``, which records each
segment's end state, operator ``P`` and remainder operator beside its outputs. Plain is the
``chunk_gated_delta_rule`` call an ordinary forward makes (inputs in the model's ``[N, T, H, D]``
layout, transposed as ``GatedDeltaNet`` does). Shapes are Qwen3.5-0.8B's linear layers: 16 value
heads, K = V = 128, fp32. Cases: one and eight 1024-token segments with an 8-token seam, eight
without a remainder, eight whose seams differ (the masked path), eight of which half have a
remainder, and an 8-token piece alone; then the plain delta rule over an 8-token piece in chunks of
64 and of 16.

``--baseline REV`` runs the same cases on the kernels of git revision ``REV`` (``git archive``
into a temporary folder), side by side in this process, and reports how far its results are from
the current ones. ``--small`` runs tiny shapes to check the script runs; its times mean nothing.
"""

from __future__ import annotations

import argparse
import importlib
import io
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from hypic_rag.kernels import algebra, delta_rule

from .common import best_of, timed, write_report

REPO = Path(__file__).resolve().parents[2]


def load_baseline(rev: str, into: Path) -> tuple[ModuleType, ModuleType]:
    """``(delta_rule, algebra)`` of the kernels at git revision ``rev``, imported as ``_baseline_kernels``."""
    blob = subprocess.run(["git", "archive", rev, "kernels"], cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    (into / "kernels").rename(into / "_baseline_kernels")
    sys.path.insert(0, str(into))
    try:
        return (
            importlib.import_module("_baseline_kernels.delta_rule"),
            importlib.import_module("_baseline_kernels.algebra"),
        )
    finally:
        sys.path.remove(str(into))


def _inputs(n: int, t: int, h: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = delta_rule.l2norm(torch.randn(n, t, h, d, generator=gen)) * d**-0.5
    k = delta_rule.l2norm(torch.randn(n, t, h, d, generator=gen))
    v = torch.randn(n, t, h, d, generator=gen)
    g = -torch.rand(n, t, h, generator=gen) * 0.1
    beta = torch.rand(n, t, h, generator=gen)
    return q, k, v, g, beta


def _plain(dr: ModuleType, x: tuple[torch.Tensor, ...], **kw: Any) -> torch.Tensor:
    out, _ = dr.chunk_gated_delta_rule(*(y.transpose(1, 2) for y in x), **kw)
    return out.transpose(1, 2)


def _seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    return best_of(repeats, lambda: timed(fn))[0]


def _max_diff(a: Any, b: Any) -> float:
    fields = ("state", "p", "out", "rest_state", "rest_p")
    pairs = [(getattr(a, f), getattr(b, f)) for f in fields if getattr(a, f) is not None]
    return max(float((x - y).abs().max()) for x, y in pairs)


def _case(
    impls: dict[str, tuple[ModuleType, ModuleType]], x: tuple[torch.Tensor, ...], rest_start: torch.Tensor, repeats: int
) -> dict[str, Any]:
    """Per implementation: plain and capture seconds (best of ``repeats``, trials interleaved so that a
    burst of load on the machine hits every variant alike) and their ratio; with a baseline, the
    results' distance."""
    calls = {
        (label, kind): fn
        for label, (dr, alg) in impls.items()
        for kind, fn in (
            ("plain_s", lambda dr=dr: _plain(dr, x)),
            ("capture_s", lambda alg=alg: alg.split_transition(*x, rest_start)),
        )
    }
    results = {label: alg.split_transition(*x, rest_start) for label, (_, alg) in impls.items()}
    for fn in calls.values():  # warm up
        fn()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for key, fn in calls.items():
            best[key] = min(best[key], timed(fn)[0])
    row: dict[str, Any] = {}
    for label in impls:
        plain, capture = best[label, "plain_s"], best[label, "capture_s"]
        row[label] = {"plain_s": plain, "capture_s": capture, "ratio": capture / plain}
    if "before" in results:
        row["max_abs_diff"] = _max_diff(results["before"], results["after"])
    return row


def cases(small: bool) -> list[tuple[str, int, int, list[int]]]:
    """``(name, N, T, rest_start per row)``."""
    t = 64 if small else 1024
    return [
        (f"1x{t}, seam 8", 1, t, [8]),
        (f"8x{t}, seam 8", 8, t, [8] * 8),
        (f"8x{t}, no remainder", 8, t, [t] * 8),
        (f"8x{t}, seams 8..{8 + 7 * 4}", 8, t, [8 + 4 * r for r in range(8)]),
        (f"8x{t}, 4 with seam 8", 8, t, [8] * 4 + [t] * 4),
        ("1x8, no remainder", 1, 8, [8]),
    ]


def run(
    baseline: str | None = None, threads: int = 1, repeats: int = 3, small: bool = False, log=print
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    h, d = (2, 16) if small else (16, 128)
    impls: dict[str, tuple[ModuleType, ModuleType]] = {"after": (delta_rule, algebra)}
    with tempfile.TemporaryDirectory() as tmp:
        if baseline is not None:
            impls = {"before": load_baseline(baseline, Path(tmp)), **impls}
        rows = []
        for name, n, t, rests in cases(small):
            row = _case(impls, _inputs(n, t, h, d), torch.tensor(rests), repeats)
            times = "  ".join(
                f"{label}: plain {r['plain_s'] * 1e3:7.1f} ms capture {r['capture_s'] * 1e3:7.1f} ms x{r['ratio']:.2f}"
                for label, r in row.items()
                if label in impls
            )
            diff = f"  |after - before| {row['max_abs_diff']:.1e}" if "max_abs_diff" in row else ""
            log(f"{name:<24} {times}{diff}")
            rows.append({"case": name, **row})

        # The chunk rule alone: an 8-token piece padded to a 64-token chunk against a 16-token one.
        x = _inputs(1, 8, h, d)
        pieces = {f"chunk {c}": _seconds(lambda c=c: _plain(delta_rule, x, chunk_size=c), repeats) for c in (64, 16)}
        pieces["default"] = _seconds(lambda: _plain(delta_rule, x), repeats)
        log("8-token piece, plain: " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in pieces.items()))
    return {"threads": threads, "heads": h, "dim": d, "cases": rows, "piece_8_tokens_s": pieces}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="git revision whose kernels to run beside the current ones")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="tiny shapes, to check the script runs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.baseline, args.threads, args.repeats, args.small)
    if args.json:
        write_report(report, args.json, "capture")


if __name__ == "__main__":
    main()
