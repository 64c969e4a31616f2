"""``hypic-rag demo`` until the bundled model ships: the runtime checked against transformers.

No trained checkpoint ships yet, so the smallest honest thing we can show is the runtime itself on
a real Hugging Face checkpoint: a tiny random-weight Qwen3.5 and Qwen3-Next, built with transformers'
own classes, loaded by hypic-rag, and compared with transformers on the same token ids.
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
    return ok
