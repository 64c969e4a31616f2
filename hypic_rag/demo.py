"""``hypic-rag demo`` until the bundled model ships: the runtime checked against transformers, then
the four modes side by side.

No trained checkpoint ships yet, so the honest things to show are on random-weight Hugging Face
checkpoints built with transformers' own classes: that hypic-rag computes what transformers computes,
and what each mode costs and how far it drifts from full recompute on a warm, reordered prompt.
Answers of a random model mean nothing, so none are printed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from .engine import Engine
from .model.parity import load_reference, logits_max_diff, reference_greedy, split_prefill_max_diff
from .model.synthetic import build_checkpoint
from .segments import Segment

TOLERANCE = 1e-4


def run(log: Callable[[str], None] = print) -> bool:
    log(
        "hypic-rag demo: no trained model ships yet, so this checks the runtime itself.\n"
        "It builds tiny random-weight checkpoints with transformers' own classes, loads them in\n"
        "hypic-rag, and compares both implementations on the same token ids (fp32, CPU).\n"
    )
    ok = True
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("qwen3_5_text", "qwen3_next_moe"):
            path = build_checkpoint(kind, Path(tmp) / kind)
            engine = Engine.from_pretrained(path)
            engine.eos_token_ids = ()
            reference = load_reference(path)
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(0, engine.config.vocab_size, (2, 512), generator=gen)
            forward = logits_max_diff(engine.model, reference, ids)
            split = split_prefill_max_diff(engine.model, ids[:, :500], 300)
            prompt = ids[0, :64].tolist()
            ours = engine.generate([], Segment(token_ids=prompt, kind="query"), mode="full", max_new_tokens=20)
            theirs = reference_greedy(reference, prompt, 20)
            same = ours.token_ids == theirs
            ok &= forward < TOLERANCE and split < TOLERANCE and same
            rows.append((kind, forward, split, same, ours.token_ids[:8]))
    log(f"{'checkpoint':<16}{'max|Δlogit| 2×512':>20}{'split prefill Δ':>18}{'greedy 20 ids':>16}")
    for kind, forward, split, same, _ in rows:
        log(f"{kind:<16}{forward:>20.1e}{split:>18.1e}{'identical' if same else 'DIFFERENT':>16}")
    log(f"\nfirst greedy ids ({rows[-1][0]}): {rows[-1][4]} ...")
    log("all checks passed" if ok else f"a check failed (tolerance {TOLERANCE})")
    modes(log)
    return ok


def modes(log: Callable[[str], None] = print, segments: int = 8, length: int = 512) -> None:
    """TTFT, cache hits and KL to full for each mode on a warm prompt whose segments were cached by
    an earlier request in another order."""
    from .eval.hypic_measure import FIDELITY_SHAPES
    from .fidelity import kl_divergence
    from .model.synthetic import build_reference_model

    log(f"\nthe four modes on a random 8-layer qwen3_5_text ({segments} segments x {length} tokens + a query):")
    with tempfile.TemporaryDirectory() as tmp:
        build_reference_model("qwen3_5_text", FIDELITY_SHAPES).save_pretrained(tmp)
        engine = Engine.from_pretrained(tmp)
    gen = torch.Generator().manual_seed(1)
    vocab = engine.config.vocab_size
    segs = [Segment(token_ids=torch.randint(3, vocab, (length,), generator=gen).tolist()) for _ in range(segments)]
    query = Segment(token_ids=torch.randint(3, vocab, (32,), generator=gen).tolist(), kind="query")
    earlier = segs[1:] + segs[:1]
    engine.generate(earlier, query, mode="hypic", max_new_tokens=1)
    engine.generate(earlier, query, mode="prefix", max_new_tokens=1)
    full = engine.prompt_logits(segs, query, mode="full")
    log(f"{'mode':<8}{'TTFT':>9}{'speedup':>9}{'hits':>6}{'recomputed':>12}{'KL(full||mode)':>16}")
    base = None
    for mode in ("full", "prefix", "pic", "hypic"):
        out = engine.generate(segs, query, mode=mode, max_new_tokens=1)
        base = base or out.ttft_s
        kl = kl_divergence(full, out.prompt_logits)
        st = out.stats
        log(
            f"{mode:<8}{out.ttft_s:>8.3f}s{base / out.ttft_s:>8.1f}x{st['hit_segments']:>6}"
            f"{st['recomputed_tokens']:>12}{kl:>16.2e}"
        )
