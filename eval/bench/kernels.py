"""GPU benchmark of HYPIC's kernels and of hypic against full prefill, in one command (< 5 minutes
on an H200-class GPU):

    python -m hypic_rag.eval.bench.kernels --json kernel-bench.json

1. Kernel throughput, Triton against the torch reference, at realistic shapes: ``transition`` over
   16k tokens of 16 heads of 128, ``compose`` of 64 segments, ``stitch`` of 512 new tokens over
   64k cached keys (8 query / 2 KV heads of 256, 64 rotary dims), ``scan_with_jumps`` over a fused
   request's 568 fresh tokens with 63 jumps, ``kda_scan`` (Kimi Linear's per-channel decay) over the
   16k tokens.
2. TTFT of warm ``hypic`` against ``full`` at 16k, 32k and 64k tokens (segments of 2k, a 64-token
   query) on the Qwen3.5-0.8B layer shapes with 8 layers, random weights, bf16.

``--device cpu --small`` runs the same code on tiny shapes (the tests use it), with ``TRITON_INTERPRET=1``
set so that the Triton kernels run interpreted; its times mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.kernels import compose, stitch, transition
from hypic_rag.kernels.kda import kda_scan
from hypic_rag.kernels.rope import rope_inv_freq
from hypic_rag.kernels.scan import Jumps, scan_with_jumps
from hypic_rag.testing.synthetic import TINY

from .common import RandomSegments, best_of, layer_shapes, random_model, speedup, timed, write_report


def _time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Best-of-``repeats`` seconds of ``fn`` after one call to compile and warm up."""
    fn()
    return best_of(repeats, lambda: timed(fn, device))[0]


def _tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor a kernel returned (a tensor, a tuple of them, a dataclass of them), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for item in out for t in _tensors(item)]
    if dataclasses.is_dataclass(out):
        return [t for f in dataclasses.fields(out) for t in _tensors(getattr(out, f.name))]
    return []


def kernels(device: torch.device, small: bool, repeats: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    t, h, d = (96, 2, 16) if small else (16384, 16, 128)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    k = torch.nn.functional.normalize(rnd(1, t, h, d), dim=-1)
    v, g, beta = rnd(1, t, h, d), -torch.rand(1, t, h, generator=gen).to(device) * 0.1, rnd(1, t, h).sigmoid()
    segs = 4 if small else 64
    p, b, s0 = rnd(segs, h, d, d) * (d**-0.5), rnd(segs, h, d, d), rnd(h, d, d)
    hq, hkv, hd, tq, s = (4, 2, 32, 8, 80) if small else (8, 2, 256, 512, 65536)
    q, kk, vv = rnd(1, hq, tq, hd), rnd(1, hkv, s + tq, hd), rnd(1, hkv, s + tq, hd)
    k_pos = torch.arange(s + tq, device=device)
    shift = torch.where(k_pos < s, k_pos // 2048 * 7, 0)
    inv = rope_inv_freq(hd // 4, 1e7).to(device)
    # A fused request's scan: 63 cached segments' seams of 8 tokens and a 64-token query (small: 3 and 8),
    # the state jumping over each segment (kernels.scan_with_jumps).
    n_jumps, seam, tail = (3, 8, 8) if small else (63, 8, 64)
    fresh = n_jumps * seam + tail
    qs = torch.nn.functional.normalize(rnd(1, fresh, h, d), dim=-1) * d**-0.5
    ks = torch.nn.functional.normalize(rnd(1, fresh, h, d), dim=-1)
    vs, bs = rnd(1, fresh, h, d), rnd(1, fresh, h).sigmoid()
    gs = -torch.rand(1, fresh, h, generator=gen).to(device) * 0.1
    at = torch.arange(1, n_jumps + 1) * seam  # on the host: the kernels plan from it
    qs_full = torch.nn.functional.normalize(rnd(1, t, h, d), dim=-1) * d**-0.5
    g_full = -torch.rand(1, t, h, d, generator=gen).to(device) * 0.1
    jumps = Jumps(at, at.clone(), p[:n_jumps].contiguous(), b[:n_jumps].contiguous())
    cases = {
        "transition": lambda backend: transition(k, v, g, beta, backend=backend),
        "scan_with_jumps": lambda backend: scan_with_jumps(qs, ks, vs, gs, bs, None, jumps, backend=backend),
        "compose": lambda backend: compose(p, b, s0, backend=backend),
        "stitch": lambda backend: stitch(q, kk, vv, k_pos[s:], k_pos, shift, inv, backend=backend),
        # Kimi Linear's KDA over the same tokens, one decay per key channel.
        "kda_scan": lambda backend: kda_scan(qs_full, k, v, g_full, beta, backend=backend),
    }
    rows = []
    for name, fn in cases.items():
        t_torch = _time(lambda fn=fn: fn("torch"), device, repeats)
        t_triton = _time(lambda fn=fn: fn("triton"), device, repeats)
        pairs = zip(_tensors(fn("torch")), _tensors(fn("triton")), strict=True)
        diff = max((float((a.float() - b.float()).abs().max()) for a, b in pairs), default=0.0)
        row = {"kernel": name, "torch_s": t_torch, "triton_s": t_triton, "speedup": t_torch / t_triton}
        rows.append({**row, "max_abs_diff": diff})
        log(f"  {name:<10} torch {t_torch * 1e3:9.2f} ms  triton {t_triton * 1e3:9.2f} ms  x{t_torch / t_triton:.2f}")
    return rows


def ttft(device: torch.device, small: bool, repeats: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    shapes = dict(TINY, max_position_embeddings=4096) if small else layer_shapes(8, max_position_embeddings=131072)
    dtype = torch.float32 if small else torch.bfloat16
    engine = Engine(random_model(shapes, device=device, dtype=dtype))
    prompts = RandomSegments(shapes["vocab_size"], seed=1)
    seg_len, lengths = (32, [128, 256]) if small else (2048, [16384, 32768, 65536])
    query = prompts.segment(64)
    rows = []
    for n in lengths:
        segs = prompts.segments(n // seg_len, seg_len)
        engine.generate(segs[::-1], query, mode="hypic", max_new_tokens=1)  # warm, in another order
        times = {}
        for mode in ("full", "hypic"):

            def trial(mode: str = mode, segs: list = segs) -> tuple[float, None]:
                return engine.generate(segs, query, mode=mode, max_new_tokens=1).ttft_s, None

            times[mode] = best_of(repeats, trial)[0]
        rows.append(
            {
                "prompt_tokens": n,
                **{f"{m}_ttft_s": v for m, v in times.items()},
                "speedup": speedup(times)["hypic"],
            }
        )
        log(
            f"  {n:>6} tokens: full {times['full']:.3f}s  hypic {times['hypic']:.3f}s  "
            f"x{times['full'] / times['hypic']:.1f}"
        )
        engine.clear_cache()
    return rows


def run(device: str = "cuda", small: bool = False, repeats: int = 3, log: Callable[[str], None] = print) -> dict:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device: this benchmark is for a GPU (use --device cpu --small to check it runs)")
    log(f"kernels on {dev}:")
    kern = kernels(dev, small, repeats, log)
    log("warm hypic against full:")
    return {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "kernels": kern,
        "ttft": ttft(dev, small, repeats, log),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes, to check the script runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.device, args.small, args.repeats)
    if args.json:
        write_report(report, args.json, "kernels")


if __name__ == "__main__":
    main()
