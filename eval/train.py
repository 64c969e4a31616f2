"""Training a small Qwen3.5-architecture hybrid on the five synthetic workloads.

    python -m hypic_rag.eval.train --out runs/probe --steps 600 --seed 0

Deterministic for a given command (seeded data, init and order; CPU). It trains a byte-level BPE
tokenizer on the generated text, builds a ``qwen3_5_text`` model with transformers' own class (its
backward pass is the reference), trains on packed sequences of whole examples with the loss on the
answer tokens, and every ``--eval-every`` steps measures greedy exact match on held-out examples
(teacher-forced: greedy decoding yields the answer exactly when every answer token is the argmax).
It writes an HF checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``generation_config.json``) and ``curves.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from hypic_rag.prompt_format import TAGS, answer_text, wrap

from .workloads import WORKLOADS, Example, make

SPECIALS = ["<pad>", "</a>", "<a>"] + [f"<{t}>" for t in TAGS.values()] + [f"</{t}>" for t in TAGS.values()]
HELD_OUT_SEED = 1_000_003


def texts(examples: Iterable[Example]) -> Iterable[str]:
    for ex in examples:
        yield from (s.text or "" for s in ex.segments)
        yield wrap("query", ex.query) + answer_text(ex.answers[0])


def train_tokenizer(examples: list[Example], vocab_size: int):
    """Byte-level BPE over the workloads' text, with the format's tags as single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts(examples), trainer)
    return tok


def encode(tok, ex: Example, questions: int = 1) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 outside the answers): each segment encoded on its own, as served,
    then up to ``questions`` question-answer pairs that the segments support (the example's own first)."""
    ids: list[int] = []
    for seg in ex.segments:
        ids += tok.encode(seg.text, add_special_tokens=False).ids
    labels = [-100] * len(ids)
    for question, answer in ex.meta.get("qa", [(ex.query, ex.answers[0])])[:questions]:
        q = tok.encode(wrap("query", question), add_special_tokens=False).ids
        a = tok.encode(answer_text(answer), add_special_tokens=False).ids
        ids += q + a
        labels += [-100] * len(q) + a
    return ids, labels


def model_config(vocab_size: int, hidden: int, layers: list[str], max_len: int) -> dict[str, Any]:
    heads = hidden // 32
    return dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 16 * 16,
        num_hidden_layers=len(layers), layer_types=layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), head_dim=32, linear_num_key_heads=max(1, heads // 2),
        linear_num_value_heads=heads, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, max_position_embeddings=max_len * 4, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )  # fmt: skip


def pack(encoded: list[tuple[list[int], list[int]]], max_len: int, pad: int, rng: random.Random):
    """Sequences of whole examples, several per sequence, padded to ``max_len``."""
    order = list(range(len(encoded)))
    rng.shuffle(order)
    seq_ids: list[int] = []
    seq_labels: list[int] = []
    for i in order:
        ids, labels = encoded[i]
        if len(ids) > max_len:
            continue
        if len(seq_ids) + len(ids) > max_len:
            yield seq_ids + [pad] * (max_len - len(seq_ids)), seq_labels + [-100] * (max_len - len(seq_ids))
            seq_ids, seq_labels = [], []
        seq_ids += ids
        seq_labels += labels
    if seq_ids:
        yield seq_ids + [pad] * (max_len - len(seq_ids)), seq_labels + [-100] * (max_len - len(seq_ids))


@torch.no_grad()
def exact_match(model, encoded: list[tuple[list[int], list[int]]]) -> float:
    hits = 0
    for ids, labels in encoded:
        x = torch.tensor([ids])
        pred = model(x).logits[0, :-1].argmax(-1)
        target = torch.tensor(labels[1:])
        mask = target != -100
        hits += bool((pred[mask] == target[mask]).all())
    return 100.0 * hits / len(encoded)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train = [ex for w in WORKLOADS for ex in make(w, args.examples, args.seed)]
    held = {w: make(w, args.eval_examples, HELD_OUT_SEED) for w in WORKLOADS}
    tok = train_tokenizer(train, args.vocab)
    pad = tok.token_to_id("<pad>")
    encoded = [encode(tok, ex, args.questions) for ex in train]
    held_enc = {w: [encode(tok, ex) for ex in exs] for w, exs in held.items()}
    layers = args.layers.split(",")
    cfg = Qwen3_5TextConfig(
        **model_config(tok.get_vocab_size(), args.hidden, layers, args.max_len),
        eos_token_id=tok.token_to_id("</a>"),
        pad_token_id=pad,
    )
    model = Qwen3_5ForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    curves: list[dict[str, Any]] = []
    print(f"{params / 1e6:.2f}M parameters, vocab {tok.get_vocab_size()}, {len(encoded)} training examples")
    step, start, epoch_data = 0, time.perf_counter(), iter(())
    while step < args.steps:
        batch = []
        while len(batch) < args.batch:
            nxt = next(epoch_data, None)
            if nxt is None:
                epoch_data = pack(encoded, args.max_len, pad, rng)
                continue
            batch.append(nxt)
        ids = torch.tensor([b[0] for b in batch])
        labels = torch.tensor([b[1] for b in batch])
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        loss = model(ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        step += 1
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            acc = {w: exact_match(model, enc) for w, enc in held_enc.items()}
            row = {"step": step, "loss": loss.item(), "lr": lr, "minutes": (time.perf_counter() - start) / 60, **acc}
            curves.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.token_to_id("</a>")}))
    report = {"args": vars(args), "parameters": params, "curves": curves}
    (out / "curves.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", type=int, default=4000, help="training examples per workload")
    parser.add_argument("--eval-examples", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", default="linear_attention,full_attention,linear_attention,full_attention")
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--questions", type=int, default=1, help="question-answer pairs per training example")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
