"""Decode and prefill tokens/s beside llama.cpp's, on the same random checkpoint and shapes.

    python -m hypic_rag.eval.bench.peer --llama-cpp DIR --json bench-peer-llamacpp.json

``DIR`` is a llama.cpp source tree with ``llama-batched-bench`` built (``build/bin/``) and its converter
(``convert_hf_to_gguf.py`` and ``gguf-py``); also read from ``$LLAMA_CPP``. Neither ships with us: where none is
found the benchmark says how to get one and stops. One way, from the package registry alone::

    pip download --no-deps --no-binary :all: llama-cpp-python     # its sdist vendors llama.cpp
    tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/vendor/llama.cpp
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    cmake --build build -j --target llama-batched-bench

1. A random ``qwen3_5_text`` checkpoint on Qwen3.5-0.8B's shapes (``layers`` decoder layers, three linear to one
   full), saved with a tokenizer, converted to a GGUF at the same dtype (f32).
2. llama.cpp: ``llama-batched-bench`` at ``threads`` threads, each of ``batches`` sequences with its own
   ``prompt_tokens``-token prompt, then ``steps`` tokens generated: its prompt and generation tokens/s.
3. Ours on the same checkpoint and threads: each batch's prompts prefilled (one forward each), then ``steps``
   decode steps of the whole batch in one forward each (``HybridModel.decode_batch``); prefill tokens/s is the
   prompt tokens over the prefill seconds, decode tokens/s ``batch * steps`` over the decode seconds.

The two take turns ``rounds`` times (llama.cpp, ours, llama.cpp, ...), and each side keeps its best round, so a
machine that slows during the run slows both. The ratios are ours over llama.cpp's. ``--int8`` adds two sides at
matched precision: llama.cpp on a Q8_0 GGUF of the same checkpoint, ours decoding from 8-bit weight copies;
``--bf16`` likewise a BF16 GGUF against ours from bfloat16 copies (``weights="bfloat16"``).

Decode is bound by reading weights, so each side's decode is also given as the bandwidth it reached: the bytes of
weights a step reads (``step_bytes``: every weight but the embedding table, of which a step reads one row a
sequence, unless the LM head shares it) over a step's seconds (a step makes one token of each sequence), beside
the machine's own read bandwidth measured in the same run (``read_bandwidth``: a reduction streaming a buffer
far larger than the caches, at the same threads). ``--also-unpacked`` adds a
third side: ours with every layer's packed weight copy off (``pack_weights=False``), plain BLAS products.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from .common import write_report

BATCHES = (1, 2, 4, 8)
INSTRUCTIONS = "see `python -m hypic_rag.eval.bench.peer --help` for building one from the llama-cpp-python sdist"


class PeerMissing(RuntimeError):
    """No llama.cpp to compare with: the benchmark says what it looked for."""


def find_llama_cpp(given: str | None) -> tuple[Path, Path]:
    """The llama.cpp tree (``given``, else ``$LLAMA_CPP``) and its built ``llama-batched-bench``."""
    root = given or os.environ.get("LLAMA_CPP")
    if not root:
        raise PeerMissing(f"no llama.cpp given (--llama-cpp DIR or $LLAMA_CPP); {INSTRUCTIONS}")
    tree = Path(root).expanduser()
    converter = tree / "convert_hf_to_gguf.py"
    if not converter.is_file():
        raise PeerMissing(f"{tree} has no convert_hf_to_gguf.py: not a llama.cpp source tree; {INSTRUCTIONS}")
    for candidate in (tree / "build" / "bin" / "llama-batched-bench", tree / "llama-batched-bench"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return tree, candidate
    raise PeerMissing(f"llama-batched-bench is not built under {tree}/build/bin; {INSTRUCTIONS}")


# llama.cpp's converter names a BPE vocabulary's pre-tokenizer by hashing what it makes of a test text, and knows
# only published ones; the synthetic checkpoint's is not. The benchmark feeds token ids and never tokenizes, so the
# converter is run with the name set (Qwen's).
_CONVERT = """
import runpy, sys
tree, converter = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = sys.argv[2:]
runpy.run_path(converter, run_name="__main__")
"""


def convert(tree: Path, checkpoint: Path, out: Path, dtype: str = "f32") -> Path:
    """``checkpoint`` as a GGUF at ``dtype``, by llama.cpp's own converter and its own ``gguf`` package."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    converter = str(tree / "convert_hf_to_gguf.py")
    command = [sys.executable, "-c", _CONVERT, str(tree), converter, str(checkpoint), "--outtype", dtype]
    command += ["--no-mtp", "--outfile", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the GGUF conversion failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return out


READ_BYTES = 1 << 30  # the buffer ``read_bandwidth`` streams: past any CPU's last-level cache


# The bytes of one projection weight a step reads, by precision: float32; ours 8-bit (a byte, and a float32 scale per
# output channel, counted apart); llama.cpp's Q8_0 (blocks of 32 bytes and a 16-bit scale); bfloat16 (both sides).
PROJECTION_BYTES = {"float32": 4.0, "int8": 1.0, "q8_0": 34 / 32, "bfloat16": 2.0, "bf16": 2.0}


def step_bytes(model: Any, precision: str = "float32") -> int:
    """The bytes of weights one decode step reads: each parameter once (a tied LM head is the embedding, read
    whole), less an embedding table the head does not share (a step reads a row of it per sequence); at
    ``precision`` the projections' weights (``Linear``) count ``PROJECTION_BYTES`` each, the rest float32."""
    from hypic_rag.model.linear import Linear

    projections = {m.weight.untyped_storage().data_ptr() for m in model.modules() if isinstance(m, Linear)}
    seen: dict[int, float] = {}
    for param in model.parameters():
        at = param.untyped_storage().data_ptr()
        if at in projections and precision != "float32":
            scales = param.shape[0] * 4 if precision == "int8" else 0
            seen[at] = param.numel() * PROJECTION_BYTES[precision] + scales
        else:
            seen[at] = param.numel() * param.element_size()
    for module in model.modules():
        table = module.weight if isinstance(module, torch.nn.Embedding) else None
        if (
            table is not None
            and table.untyped_storage().data_ptr() != model.lm_head.weight.untyped_storage().data_ptr()
        ):
            seen.pop(table.untyped_storage().data_ptr(), None)
    return int(sum(seen.values()))


def read_bandwidth(threads: int, size: int = READ_BYTES, repeats: int = 5) -> float:
    """The machine's read bandwidth in bytes/s, as a sum over ``size`` bytes of float32 streams it: the best of
    ``repeats`` at ``threads`` threads."""
    torch.set_num_threads(threads)
    buffer = torch.ones(size // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return size / best


def bandwidths(speeds: dict[int, dict[str, float]], weight_bytes: int) -> dict[str, float]:
    """Each batch's decode as bytes/s of weights read: a step makes ``batch`` tokens and reads the weights once."""
    return {str(b): weight_bytes * s["decode_tokens_per_s"] / b for b, s in sorted(speeds.items())}


def llama_round(
    bench: Path, gguf: Path, threads: int, prompt_tokens: int, steps: int, batches: Sequence[int]
) -> dict[int, dict[str, float]]:
    """One run of ``llama-batched-bench``: per batch size, prompt and generation tokens/s."""
    context = max(batches) * (prompt_tokens + steps) + 16
    command = [str(bench), "-m", str(gguf), "-c", str(context), "-b", "2048", "-ub", "512", "-ngl", "0"]
    command += ["-npp", str(prompt_tokens), "-ntg", str(steps), "-npl", ",".join(map(str, batches))]
    command += ["-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {int(r["pl"]): {"prefill_tokens_per_s": r["speed_pp"], "decode_tokens_per_s": r["speed_tg"]} for r in rows}


def our_round(
    model: Any, prompt_tokens: int, steps: int, batches: Sequence[int], seed: int = 0
) -> dict[int, dict[str, float]]:
    """Ours, as the module docstring says: per batch size, prefill and decode tokens/s."""
    out: dict[int, dict[str, float]] = {}
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        warm = model.new_state()  # each layer packs its weight on first use: not in any timed round
        model.decode_batch([int(model(torch.tensor([[3, 4, 5]]), state=warm)[0, -1].argmax())], [warm])
        for batch in batches:
            states, tokens = [], []
            start = time.perf_counter()
            for _ in range(batch):
                state = model.new_state()
                ids = torch.randint(3, model.config.vocab_size, (1, prompt_tokens), generator=gen)
                tokens.append(int(model(ids, state=state, logits_to_keep=1)[0, -1].argmax()))
                states.append(state)
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(steps):
                tokens = model.decode_batch(tokens, states).argmax(-1).tolist()
            decode = time.perf_counter() - start
            out[batch] = {
                "prefill_tokens_per_s": batch * prompt_tokens / prefill,
                "decode_tokens_per_s": batch * steps / decode,
            }
    return out


@dataclass(frozen=True)
class Matched:
    """A precision both sides decode at: ours (``weights=``, switched on by the model's ``switch``) against
    llama.cpp's converter ``outtype``."""

    ours: str
    switch: str
    outtype: str
    theirs: str


MATCHED = (
    Matched("int8", "decode_int8", "q8_0", "llama.cpp Q8_0"),
    Matched("bfloat16", "decode_bf16", "bf16", "llama.cpp BF16"),
)


def _llama_side(
    bench: Path, gguf: Path, threads: int, prompt_tokens: int, steps: int, batches: Sequence[int], _: int
) -> dict[int, dict[str, float]]:
    return llama_round(bench, gguf, threads, prompt_tokens, steps, batches)


def _switched(
    switch: Callable[[bool], None],
    on: bool,
    model: Any,
    prompt_tokens: int,
    steps: int,
    batches: Sequence[int],
    seed: int,
) -> dict:
    """``our_round`` with one of the model's weight copies switched to ``on`` (``pack_weights`` off: plain BLAS
    products; ``decode_int8`` or ``decode_bf16`` on: 8-bit or bfloat16 copies, built in its untimed warm-up), then
    switched back."""
    switch(on)
    try:
        return our_round(model, prompt_tokens, steps, batches, seed)
    finally:
        switch(not on)


def run(
    llama_cpp: str | None = None,
    layers: int = 24,
    threads: int = 2,
    prompt_tokens: int = 128,
    steps: int = 16,
    batches: Sequence[int] = BATCHES,
    rounds: int = 2,
    also_unpacked: bool = False,
    int8: bool = False,
    log: Callable[[str], None] = print,
    bf16: bool = False,
) -> dict[str, Any]:
    """``int8``: also llama.cpp on a Q8_0 GGUF of the same checkpoint against ours decoding from 8-bit weights
    (``Engine.from_pretrained(weights="int8")``), in the same turns; ``bf16`` likewise a BF16 GGUF against ours
    from bfloat16 copies (``weights="bfloat16"``)."""
    from hypic_rag.model import load_model

    from .server import build_checkpoint

    tree, bench = find_llama_cpp(llama_cpp)
    torch.set_num_threads(threads)
    report: dict[str, Any] = {
        "benchmark": "peer",
        "peer": "llama.cpp llama-batched-bench",
        "llama_cpp": str(tree),
        "layers": layers,
        "dtype": "float32",
        "threads": threads,
        "prompt_tokens": prompt_tokens,
        "steps": steps,
        "rounds": rounds,
    }
    with tempfile.TemporaryDirectory() as tmp:
        log(f"random qwen3_5_text on Qwen3.5-0.8B shapes, {layers} layers")
        checkpoint = build_checkpoint(Path(tmp) / "model", layers)
        gguf = convert(tree, checkpoint, Path(tmp) / "model-f32.gguf")
        model = load_model(checkpoint, dtype=torch.float32)
        weight_bytes = step_bytes(model)
        machine = read_bandwidth(threads)
        log(f"a decode step reads {weight_bytes / 1e9:.2f} GB of weights; the machine reads {machine / 1e9:.1f} GB/s")
        ours: dict[int, dict[str, float]] = {}
        theirs: dict[int, dict[str, float]] = {}
        unpacked: dict[int, dict[str, float]] = {}
        sides: list[tuple[str, Callable[[int], dict[int, dict[str, float]]], dict[int, dict[str, float]]]] = [
            ("llama.cpp", lambda i: llama_round(bench, gguf, threads, prompt_tokens, steps, batches), theirs),
            ("ours", lambda i: our_round(model, prompt_tokens, steps, batches, seed=i), ours),
        ]
        if also_unpacked:
            unpack = partial(_switched, model.pack_weights, False, model, prompt_tokens, steps, batches)
            sides.append(("ours unpacked", unpack, unpacked))
        wanted = {"int8": int8, "bfloat16": bf16}
        matched = [p for p in MATCHED if wanted[p.ours]]
        at_precision: dict[str, tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]] = {}
        for p in matched:
            gguf_p = convert(tree, checkpoint, Path(tmp) / f"model-{p.outtype}.gguf", p.outtype)
            at_precision[p.ours] = ({}, {})
            sides.append(
                (
                    p.theirs,
                    partial(_llama_side, bench, gguf_p, threads, prompt_tokens, steps, batches),
                    at_precision[p.ours][1],
                )
            )
            switch = getattr(model, p.switch)
            sides.append(
                (
                    f"ours {p.ours}",
                    partial(_switched, switch, True, model, prompt_tokens, steps, batches),
                    at_precision[p.ours][0],
                )
            )
        for i in range(rounds):
            for side, measure, best in sides:
                got = measure(i)
                for batch, speeds in got.items():
                    kept = best.setdefault(batch, dict(speeds))
                    for key, value in speeds.items():
                        kept[key] = max(kept[key], value)
                row = ", ".join(f"b{b} {s['decode_tokens_per_s']:.1f}" for b, s in sorted(got.items()))
                log(f"  round {i + 1} {side}: decode tokens/s {row}")
    report["llama_cpp_tokens_per_s"] = {str(b): theirs[b] for b in batches}
    report["ours_tokens_per_s"] = {str(b): ours[b] for b in batches}
    report["ours_over_llama_cpp"] = {
        str(b): {key: ours[b][key] / theirs[b][key] for key in ours[b]} for b in batches if b in theirs
    }
    if unpacked:
        report["ours_unpacked_tokens_per_s"] = {str(b): unpacked[b] for b in batches}
        report["ours_over_unpacked"] = {str(b): {k: ours[b][k] / unpacked[b][k] for k in ours[b]} for b in batches}
    report["weight_bytes_per_step"] = weight_bytes
    report["machine_read_bytes_per_s"] = machine
    report["decode_weight_bytes_per_s"] = {
        "llama.cpp": bandwidths(theirs, weight_bytes),
        "ours": bandwidths(ours, weight_bytes),
    }
    if unpacked:
        report["decode_weight_bytes_per_s"]["ours unpacked"] = bandwidths(unpacked, weight_bytes)
    for p in matched:
        mine, peer = at_precision[p.ours]
        ours_bytes, their_bytes = step_bytes(model, p.ours), step_bytes(model, p.outtype)
        report[f"llama_cpp_{p.outtype}_tokens_per_s"] = {str(b): peer[b] for b in batches}
        report[f"ours_{p.ours}_tokens_per_s"] = {str(b): mine[b] for b in batches}
        ratios = {str(b): {key: mine[b][key] / peer[b][key] for key in mine[b]} for b in batches if b in peer}
        report[f"ours_{p.ours}_over_llama_cpp_{p.outtype}"] = ratios
        report[f"weight_bytes_per_step_{p.ours}"] = {f"ours {p.ours}": ours_bytes, p.theirs: their_bytes}
        report["decode_weight_bytes_per_s"][p.theirs] = bandwidths(peer, their_bytes)
        report["decode_weight_bytes_per_s"][f"ours {p.ours}"] = bandwidths(mine, ours_bytes)
        for b, ratio in ratios.items():
            log(f"batch {b}, {p.ours}: decode {ratio['decode_tokens_per_s']:.2f}x {p.theirs}")
    for b, ratio in report["ours_over_llama_cpp"].items():
        read = {side: rates[b] / 1e9 for side, rates in report["decode_weight_bytes_per_s"].items()}
        log(
            f"batch {b}: decode {ratio['decode_tokens_per_s']:.2f}x, prefill {ratio['prefill_tokens_per_s']:.2f}x; "
            + ", ".join(f"{side} {gbs:.1f} GB/s" for side, gbs in read.items())
            + f" of the machine's {machine / 1e9:.1f}"
        )
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp", default=None, help="a llama.cpp tree with llama-batched-bench built")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--also-unpacked", action="store_true", help="also ours without packed weight copies")
    parser.add_argument(
        "--int8", action="store_true", help="also llama.cpp on a Q8_0 GGUF against ours from 8-bit weights"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="also llama.cpp on a BF16 GGUF against ours from bfloat16 weights"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        report = run(
            args.llama_cpp,
            args.layers,
            args.threads,
            args.prompt_tokens,
            args.steps,
            rounds=args.rounds,
            also_unpacked=args.also_unpacked,
            int8=args.int8,
            bf16=args.bf16,
        )
    except PeerMissing as exc:
        raise SystemExit(f"peer benchmark skipped: {exc}") from None
    if args.json:
        write_report(report, args.json, "peer")


if __name__ == "__main__":
    main()
