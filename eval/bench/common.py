"""The benchmarks' one scaffolding: random-weight checkpoints, random-token segments, a best-of timer.

- ``layer_shapes``, ``random_checkpoint``, ``random_model``, ``random_engine``: a random ``qwen3_5_text``
  checkpoint (Qwen3.5-0.8B layer shapes unless told otherwise), transformers' model of it (the
  reference) and our runtime or an ``Engine`` on it.
- ``RandomSegments``: random-token segments, fresh ids for every new segment, seeded.
- ``timed``, ``best_of``: wall-clock seconds of one run, the fastest of several.
- ``measure``: best-of TTFT of one mode (or of transformers' own forward) on one prompt, warm or cold.
- ``reordered``, ``speedup``.
"""

from __future__ import annotations

import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch

from hypic_rag import Engine, Segment
from hypic_rag.engine import MODES
from hypic_rag.model import load_model
from hypic_rag.testing.synthetic import QWEN3_5_0_8B_SHAPES, build_reference_model, hybrid_layer_types

T = TypeVar("T")
IMPLEMENTATIONS = (*MODES, "transformers")


# -- random checkpoints ---------------------------------------------------------------------------


def layer_shapes(layers: int, shapes: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """``shapes`` (Qwen3.5-0.8B's unless given) with ``layers`` decoder layers, three linear to one full."""
    out = {**(shapes or QWEN3_5_0_8B_SHAPES), "num_hidden_layers": layers, **overrides}
    out["layer_types"] = hybrid_layer_types(layers)
    return out


@contextmanager
def random_checkpoint(shapes: dict[str, Any], seed: int = 0) -> Iterator[tuple[Any, Path]]:
    """transformers' random-weight ``qwen3_5_text`` model on ``shapes`` and the folder it is saved in,
    which lasts as long as the ``with`` block."""
    reference = build_reference_model("qwen3_5_text", shapes, seed)
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        yield reference, Path(tmp)


def random_model(shapes: dict[str, Any], seed: int = 0, **load: Any):
    """Our runtime's model of a random checkpoint; transformers' copy is freed. ``load``: device, dtype."""
    with random_checkpoint(shapes, seed) as (_, path):
        return load_model(path, **load)


def random_engine(
    layers: int, shapes: dict[str, Any] | None, log: Callable[[str], None], **options: Any
) -> tuple[Engine, Any, int]:
    """A random checkpoint (Qwen3.5-0.8B layer shapes unless ``shapes``), transformers' model of it and
    an engine on it that caches segments of any length; ``options`` go to the engine. Returns the
    engine, the reference and the vocabulary size."""
    shapes = layer_shapes(layers, shapes, max_position_embeddings=262144)
    log(f"random qwen3_5_text, hidden {shapes['hidden_size']}, {layers} layers")
    with random_checkpoint(shapes) as (reference, path):
        engine = Engine.from_pretrained(path, **{"min_cached_tokens": 1, **options})
    return engine, reference, shapes["vocab_size"]


# -- prompts --------------------------------------------------------------------------------------


class RandomSegments:
    """Random-token segments for one benchmark run: fresh ids (from 3 up, clear of the special ids)
    for every new segment, from one seeded generator (``gen``)."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.gen, self.vocab = torch.Generator().manual_seed(seed), vocab

    def segment(self, length: int, kind: str = "document") -> Segment:
        return Segment(token_ids=torch.randint(3, self.vocab, (length,), generator=self.gen).tolist(), kind=kind)

    def segments(self, n: int, length: int, kind: str = "document") -> list[Segment]:
        return [self.segment(length, kind) for _ in range(n)]


def reordered(segments: list[Segment]) -> list[Segment]:
    """The same segments in another order, the first one moved (so exact prefix reuse finds nothing)."""
    order = list(range(len(segments)))
    random.Random(0).shuffle(order)
    if len(order) > 1 and order[0] == 0:
        order = order[1:] + order[:1]
    return [segments[i] for i in order]


# -- timing ---------------------------------------------------------------------------------------


def timed(fn: Callable[[], T], device: torch.device | None = None) -> tuple[float, T]:
    """Wall-clock seconds of one call of ``fn`` and what it returned; on CUDA, queued work is waited for
    before and after."""
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def best_of(repeats: int, trial: Callable[[], tuple[float, T]], warmup: int = 1) -> tuple[float, T]:
    """The fastest of ``repeats`` trials, each returning (seconds, result), and the fastest one's result, after
    ``warmup`` untimed trials: a first run pays for lazy setup (allocations, packed weights, compiled paths) that
    would otherwise show as a speedup of whatever ran second."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        trial()
    best: tuple[float, T] | None = None
    for _ in range(repeats):
        t, out = trial()
        if best is None or t < best[0]:
            best = (t, out)
    assert best is not None
    return best


def speedup(times: Mapping[str, float], base: str = "full", keep_base: bool = False) -> dict[str, float]:
    """How many times faster than ``base`` each entry ran (``base``'s time over its own); ``base``
    itself (1.0) only with ``keep_base``."""
    return {k: times[base] / t for k, t in times.items() if keep_base or k != base}


def check_modes(modes: Sequence[str]) -> None:
    unknown = [m for m in modes if m not in IMPLEMENTATIONS]
    if unknown or "full" not in modes:
        raise ValueError(f"modes must include 'full' and come from {', '.join(IMPLEMENTATIONS)}; got {list(modes)}")


def measure(
    engine: Engine,
    reference: Any,
    docs: list[Segment],
    query: Segment,
    mode: str,
    warm: list[Segment] | None,
    repeats: int,
    seam: int | float | None = None,
) -> dict[str, Any]:
    """Best-of-``repeats`` TTFT of one mode (or ``transformers``, the reference's own forward); ``warm``
    segments are cached by an earlier request first."""
    ids = torch.tensor([[i for s in [*docs, query] for i in s.token_ids]])

    def trial() -> tuple[float, dict[str, Any]]:
        if mode == "transformers":
            with torch.inference_mode():
                t, _ = timed(lambda: int(reference(ids, logits_to_keep=1, use_cache=False).logits[0, -1].argmax()))
            return t, {"hit_segments": 0, "recomputed_tokens": ids.shape[1]}
        engine.clear_cache()
        if warm and mode in ("prefix", "pic", "hypic"):
            engine.generate(warm, query, mode=mode, max_new_tokens=1, seam=seam)
        out = engine.generate(docs, query, mode=mode, max_new_tokens=1, seam=seam)
        return out.ttft_s, out.stats

    best, stats = best_of(repeats, trial)
    return {
        "mode": mode,
        "ttft_s": best,
        "prompt_tokens": ids.shape[1],
        "segments": len(docs),
        "hit_ratio": stats.get("hit_segments", 0) / len(docs),
        "recomputed_tokens": stats.get("recomputed_tokens", ids.shape[1]),
        "cache_bytes": stats.get("cache_bytes", 0),
    }


def run_header(name: str) -> dict[str, Any]:
    """What every benchmark's JSON opens with, so that two results can be told apart: the benchmark, the code
    (package version and git revision, ``+dirty`` with uncommitted changes), the software, the machine and the
    command."""
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[2]
    try:
        rev = (
            subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        revision = f"{rev}+dirty" if rev and dirty else rev
    except (OSError, subprocess.SubprocessError):  # not a checkout, or no git: the version says enough
        revision = None
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or platform.machine()
    return {
        "benchmark": name,
        "hypic_rag": version("hypic-rag"),
        "revision": revision,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "threads": torch.get_num_threads(),
        "argv": sys.argv[1:],
    }


def write_report(report: Mapping[str, Any], path: Path | str | None, name: str) -> None:
    """``report`` as JSON at ``path`` (nothing when None), under ``run_header(name)``: the one writer of every
    benchmark's results."""
    if path is None:
        return
    Path(path).write_text(json.dumps({"run": run_header(name), **report}, indent=2) + "\n")
    print(f"wrote {path}")
