"""Training a small Qwen3.5-architecture hybrid on the five synthetic workloads.

    python -m hypic_rag.training --out runs/probe --steps 600 --seed 0

Deterministic for a given command (seeded data, init and order; CPU). It trains a byte-level BPE
tokenizer on generated text, builds a ``qwen3_5_text`` model with transformers' own class (its
backward pass is the reference) and trains on one example per row, the loss on the answer tokens
plus ``--context-loss`` on the rest. Prompts are the examples' messages through the bundled model's
chat template (the format's one home), each segment encoded on its own as the engine serves it.
Training examples are drawn fresh for every window of batches and never repeat: on a fixed set the
model memorised its examples instead of learning to retrieve.
The first ``--drills`` steps are dense key-value drills (where the retrieval circuit forms); after
them a ``--recall`` share of each window is recall drills in the prompt format (both in ``drills``),
a ``--sentences`` share is dense relation-sentence drills, a ``--copy`` share dense copying of made-up
names, ``--mix`` weighs the workloads, and a
first ``--curriculum`` share of the steps uses smaller examples. docs/training-log.md gives the chain of runs
(each ``--init`` from the last) that made the bundled model. Every
``--eval-every`` steps it measures greedy exact match on held-out examples (teacher-forced: greedy
decoding yields the answer exactly when every answer token is the argmax) and writes an HF
checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``generation_config.json``,
``chat_template.jinja``) and ``curves.json``; ``--init`` continues from one, and with ``--grow`` first
grows it to ``--hidden`` and ``--layers`` computing the same function (``grow``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from hypic_rag.chat.formats.bundled import ANSWER, END, bundled_template
from hypic_rag.chat.segmentation import flat_prompt, plain_messages
from hypic_rag.chat.tool_calls import THINK_CLOSE, THINK_OPEN
from hypic_rag.eval.data.names import HELD_OUT
from hypic_rag.eval.data.workloads import HELD_OUT_WORKLOADS, WORKLOADS, Example, make, render
from hypic_rag.segments import KINDS

from .drills import NAMED_DRILLS, SKILL_DRILLS, copy_drills, kv_drills, recall_examples, sentence_drills
from .grow import grow

# The default mix and the tokenizer's text: the scored workloads the bundled model v4 was trained on, and agent
# steps. framework_qa and the skill drills join a run through --mix, as they did for v5.
TRAIN_MIX = ("single_doc", "multi_hop", "aggregate", "tool_call", "memory", "agent")
# Chat front ends add these around the prompt; the model sees some in training so they don't throw it.
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "Answer the question using only the documents.",
    "You are a concise assistant. Use the tools when needed.",
]
QUESTION_PREFIXES = ["Question: ", "Answer the question. ", "Use the context to answer. Question: "]
HELD_OUT_SEED = 1_000_003


def special_tokens() -> list[str]:
    """The tokenizer's special tokens: padding, the answer's end (the EOS), the answer tag, then every tag the
    bundled template writes, opening and closing, found by rendering one piece of each kind and a question."""
    parts = [{"type": "text", "text": "x", "hypic": {"kind": kind}} for kind in KINDS if kind != "query"]
    messages = plain_messages([{"role": "user", "content": [*parts, {"type": "text", "text": "x"}]}])
    tags = [t for t in dict.fromkeys(re.findall(r"</?[^<>\s/]+>", bundled_template().render(messages))) if t != ANSWER]
    return [
        "<pad>",
        END,
        ANSWER,
        *(t for t in tags if not t.startswith("</")),
        *(t for t in tags if t.startswith("</")),
    ]


def system_text(prompt: str) -> str:
    """A system prompt as the bundled template writes it: one segment."""
    return bundled_template().render([{"role": "system", "content": prompt}], add_generation_prompt=False)


def texts(examples: Iterable[Example]) -> Iterable[str]:
    yield from (system_text(s) for s in SYSTEM_PROMPTS)
    yield from QUESTION_PREFIXES
    for ex in examples:
        rendered = render(ex)
        yield from (s.text or "" for s in rendered.segments)
        yield rendered.query.text + ex.answers[0] + END


def train_tokenizer(examples: list[Example], vocab_size: int):
    """Byte-level BPE over the workloads' text, with the format's tags as single tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Whitespace is its own token, so a name is the same token after a space, a tag or a quote, and
    # copying it into an answer or a JSON argument is copying one id.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens(), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts(examples), trainer)
    return tok


def encode(tok, ex: Example, questions: int = 1, rng: random.Random | None = None) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 outside the answers): the example's prompt through the bundled template,
    each segment encoded on its own, as served, then up to ``questions`` question-answer pairs that the
    segments support (the example's own first), each the query segment, the answer (after its reasoning in
    a ``<think>`` block where the example has one: a worked step a small model cannot take within one
    forward pass; ``Engine.chat`` splits it off as reasoning) and the EOS. With ``rng``, some examples get a
    system segment first (before any tool schemas: the model was trained so, though the template puts the
    tools first) and some questions a chat-style prefix."""
    if "completion" in ex.meta:
        return _encode_flat(tok, ex.meta["completion"], ex.answers[0])
    rendered = render(ex)
    texts = [seg.text or "" for seg in rendered.segments]
    if rng is not None and rng.random() < 0.25:
        texts.insert(0, system_text(rng.choice(SYSTEM_PROMPTS)))
    ids: list[int] = []
    for text in texts:
        ids += tok.encode(text, add_special_tokens=False).ids
    labels = [-100] * len(ids)
    eos = tok.token_to_id(END)
    for question, answer in ex.meta.get("qa", [(ex.query, ex.answers[0])])[:questions]:
        thought = ex.meta.get("reasoning", {}).get(question)
        if rng is not None and rng.random() < 0.15:
            question = rng.choice(QUESTION_PREFIXES) + question
        query = rendered.query if question == ex.query else render(ex, question=question).query
        q = tok.encode(query.text or "", add_special_tokens=False).ids
        target = answer if thought is None else f"{THINK_OPEN}{thought}{THINK_CLOSE}{answer}"
        a = tok.encode(target, add_special_tokens=False).ids + [eos]
        ids += q + a
        labels += [-100] * len(q) + a
    return ids, labels


def _encode_flat(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """A flat prompt as the completions route serves it (``flat_prompt``: no chat template, each segment encoded on
    its own), then the answer and the EOS: the route continues the text, and the model ends an answer with EOS."""
    segments, query = flat_prompt(prompt)
    ids: list[int] = []
    for seg in [*segments, query]:
        ids += tok.encode(seg.text or "", add_special_tokens=False).ids
    a = tok.encode(answer, add_special_tokens=False).ids + [tok.token_to_id(END)]
    return ids + a, [-100] * len(ids) + a


def model_config(
    vocab_size: int, hidden: int, layers: list[str], attn_head_dim: int = 64, conv_kernel: int = 4
) -> dict[str, Any]:
    """A small Qwen3.5 text config. Attention heads are 64 wide even at hidden 128: with q/k RMS-normed,
    the widest attention logit a head can start with grows with sqrt(head_dim), and retrieval over a few
    hundred tokens needs sharp attention."""
    heads = hidden // 32
    return dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 16 * 16,
        num_hidden_layers=len(layers), layer_types=layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), head_dim=attn_head_dim, linear_num_key_heads=max(1, heads // 2),
        linear_num_value_heads=heads, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=conv_kernel, max_position_embeddings=8192, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )  # fmt: skip


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only: decaying the (1 + w) norm scales would pull attention back to flat."""
    decay: list[torch.nn.Parameter] = []
    keep: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in name else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def batches(encoded: list[tuple[list[int], list[int]]], size: int, pad: int, rng: random.Random):
    """One example per row (neighbours never see each other's names), rows of similar length
    together, padded on the right to the longest row of the batch."""
    order = list(range(len(encoded)))
    rng.shuffle(order)
    window = size * 32
    for w in range(0, len(order), window):
        chunk = sorted(order[w : w + window], key=lambda i: len(encoded[i][0]))
        rows = [chunk[i : i + size] for i in range(0, len(chunk), size)]
        rng.shuffle(rows)
        for row in rows:
            if len(row) < size:
                continue
            width = max(len(encoded[i][0]) for i in row)
            ids = [encoded[i][0] + [pad] * (width - len(encoded[i][0])) for i in row]
            labels = [encoded[i][1] + [-100] * (width - len(encoded[i][1])) for i in row]
            yield torch.tensor(ids), torch.tensor(labels)


def weighted_loss(logits: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, pad: int, context: float):
    """Next-token cross-entropy: answer tokens weigh 1, other prompt tokens ``context`` (0: answers only).

    Context tokens carry a dense copying signal (names recur within a document) that answers alone lack.
    """
    logits, ids, labels = logits[:, :-1].float(), ids[:, 1:], labels[:, 1:]
    answer = labels != -100
    weight = answer.float() + context * ((~answer) & (ids != pad)).float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    return (nll * weight).sum() / weight.sum()


@torch.no_grad()
def exact_match(model, encoded: list[tuple[list[int], list[int]]]) -> float:
    hits = 0
    device = next(model.parameters()).device
    for ids, labels in encoded:
        x = torch.tensor([ids], device=device)
        pred = model(x).logits[0, :-1].argmax(-1)
        target = torch.tensor(labels[1:], device=device)
        mask = target != -100
        hits += bool((pred[mask] == target[mask]).all())
    return 100.0 * hits / len(encoded)


def fresh_window(
    k: int,
    n: int,
    seed: int,
    small: bool,
    recall: float,
    mix: tuple[str, ...] = TRAIN_MIX,
    broad: bool = False,
    phrases: bool = False,
    open_names: float = 0.0,
) -> list[Example]:
    """Window ``k`` of the training stream: ``n`` examples never drawn before (each window has its own
    seed, far from the held-out one), a ``recall`` share of them drills (a third of them ``phrases``
    and half the rest ``broad``, if asked), the rest spread over ``mix`` (a workload named twice gets
    twice the examples; a name in ``SKILL_DRILLS`` is a skill drill); an ``open_names`` share of each
    workload's examples names its people, places and companies with fresh words (``names.TRAINING``), so that
    an answer can only be copied."""
    window_seed = (seed + 1) * 100_000_000 + k
    drills = round(recall * n)
    per = max(1, (n - drills) // len(mix))
    phrase_drills = drills // 3 if phrases else 0
    broad_drills = (drills - phrase_drills) // 2 if broad else 0
    out = recall_examples(drills - phrase_drills - broad_drills, window_seed)
    out += recall_examples(broad_drills, window_seed, broad=True)
    out += recall_examples(phrase_drills, window_seed, phrases=True)
    for w, times in Counter(mix).items():
        fresh = round(open_names * per * times) if w not in SKILL_DRILLS or w in NAMED_DRILLS else 0
        out += examples(w, per * times - fresh, window_seed, small)
        out += examples(w, fresh, window_seed, small, names="open")
    return out


def examples(name: str, n: int, seed: int, small: bool = False, names: str = "pools") -> list[Example]:
    """``n`` examples of a workload (its names from ``names``: ``workloads.NAMES``) or a skill drill
    (``SKILL_DRILLS``, from the pools but for ``NAMED_DRILLS``)."""
    if n <= 0:
        return []
    if name in NAMED_DRILLS:
        return SKILL_DRILLS[name](n, seed, small, names=names)
    if name in SKILL_DRILLS:
        return SKILL_DRILLS[name](n, seed, small)
    return make(name, n, seed, small=small, names=names)


def parse_mix(mix: str) -> tuple[str, ...]:
    """``--mix``: workloads and skill drills, comma-separated; a name given twice weighs twice."""
    names = tuple(m.strip() for m in mix.split(","))
    held = [m for m in names if m in HELD_OUT_WORKLOADS]
    if held:
        raise ValueError(f"--mix: {', '.join(map(repr, held))} is the held-out split, scored and never trained on")
    known = (*dict.fromkeys(w for w in (*WORKLOADS, *TRAIN_MIX) if w not in HELD_OUT_WORKLOADS), *SKILL_DRILLS)
    unknown = [m for m in names if m not in known]
    if unknown:
        raise ValueError(f"--mix: unknown {', '.join(map(repr, unknown))}; expected names from {', '.join(known)}")
    return names


def build_model(args: argparse.Namespace):
    """A fresh model and tokenizer, or (``--init``) the checkpoint to continue from."""
    from tokenizers import Tokenizer
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if args.init:
        init = Path(args.init)
        if not (init / "config.json").is_file() or not (init / "tokenizer.json").is_file():
            # checked here, since transformers would take a missing path for a hub id and retry the network
            raise ValueError(f"--init {args.init}: not a checkpoint directory (config.json and tokenizer.json)")
        model, tok = Qwen3_5ForCausalLM.from_pretrained(init), Tokenizer.from_file(str(init / "tokenizer.json"))
        if not args.grow:
            return model, tok
        layers = args.layers.split(",")
        cfg = Qwen3_5TextConfig(
            **model_config(model.config.vocab_size, args.hidden, layers, model.config.head_dim, args.conv_kernel),
            eos_token_id=model.config.eos_token_id,
            pad_token_id=model.config.pad_token_id,
        )
        return grow(model, cfg, args.seed), tok
    tok = train_tokenizer([ex for w in TRAIN_MIX for ex in make(w, args.examples, args.seed)], args.vocab)
    cfg = Qwen3_5TextConfig(
        **model_config(tok.get_vocab_size(), args.hidden, args.layers.split(","), args.attn_head_dim, args.conv_kernel),
        eos_token_id=tok.token_to_id(END),
        pad_token_id=tok.token_to_id("<pad>"),
    )
    return Qwen3_5ForCausalLM(cfg), tok


def _device(name: str) -> torch.device:
    """The device to train on; a clear error where it is missing (a GPU run is prepared on CPU)."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA device here")
    return device


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = _device(args.device)
    if not 0.0 <= args.sentences <= 1.0:
        raise ValueError(f"--sentences is a share of each window, from 0 to 1; got {args.sentences}")
    if not 0.0 <= args.open_names <= 1.0:
        raise ValueError(f"--open-names is a share of each workload's examples, from 0 to 1; got {args.open_names}")
    if not 0.0 <= args.copy <= 1.0 - args.sentences:
        raise ValueError(f"--copy is a share of each window, from 0 to 1 less --sentences; got {args.copy}")
    if args.sentence_lists and not args.sentences:
        raise ValueError("--sentence-lists shapes the sentence drills: give --sentences a share above 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model, tok = build_model(args)
    model.to(device)
    pad = tok.token_to_id("<pad>")
    mix = parse_mix(args.mix)
    held = {w: examples(w, args.eval_examples, HELD_OUT_SEED) for w in dict.fromkeys((*TRAIN_MIX, *mix))}
    held["recall"] = recall_examples(args.eval_examples, HELD_OUT_SEED)
    if args.broad_recall:
        held["broad_recall"] = recall_examples(args.eval_examples, HELD_OUT_SEED, broad=True)
    if args.phrase_recall:
        held["phrase_recall"] = recall_examples(args.eval_examples, HELD_OUT_SEED, phrases=True)
    if args.open_names or args.copy:  # how far copying has come: the held-out split, never trained on
        held.update({w: examples(w, args.eval_examples, HELD_OUT_SEED) for w in HELD_OUT_WORKLOADS})
    held_enc = {w: [encode(tok, ex) for ex in exs] for w, exs in held.items()}
    if args.copy:  # copying by held-out namer, each a script or a syllable shape the training never saw
        held_enc["copy"] = copy_drills(tok, args.eval_examples, HELD_OUT_SEED, asked=1)
        for namer in HELD_OUT:
            held_enc[f"copy:{namer.label}"] = copy_drills(tok, args.eval_examples, HELD_OUT_SEED, (namer,), asked=1)
    if args.sentences:
        held_enc["sentences"] = sentence_drills(tok, args.eval_examples, HELD_OUT_SEED, asked=1)
    if args.sentence_lists:  # only with --sentences (checked above)
        held_enc["sentence_lists"] = sentence_drills(tok, args.eval_examples, HELD_OUT_SEED, asked=1, lists=True)
    if args.drills:
        held_enc["kv"] = kv_drills(tok, args.eval_examples, HELD_OUT_SEED, spaced=args.drill_spaces)
    augment = random.Random(f"augment:{args.seed}")
    small_steps = int(args.curriculum * args.steps)

    def window(k: int, step: int) -> list[tuple[list[int], list[int]]]:
        drill_seed = (args.seed + 1) * 100_000_000 + k
        if step < args.drills:
            return kv_drills(tok, args.batch * 32, drill_seed, spaced=args.drill_spaces)
        small = step < args.drills + small_steps
        dense = round(args.sentences * args.batch * 32)
        out = sentence_drills(tok, dense, drill_seed, lists=args.sentence_lists) if dense else []
        copies = round(args.copy * args.batch * 32)
        out += copy_drills(tok, copies, drill_seed) if copies else []
        dense += copies
        if dense < args.batch * 32:
            exs = fresh_window(
                k,
                args.batch * 32 - dense,
                args.seed,
                small,
                args.recall,
                mix,
                args.broad_recall,
                args.phrase_recall,
                args.open_names,
            )
            out += (encode(tok, ex, args.questions, augment) for ex in exs)
        return [e for e in out if len(e[0]) <= args.max_len]

    params = sum(p.numel() for p in model.parameters())
    previous = lineage(args.init)
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=args.lr, betas=(0.9, 0.95))
    curves: list[dict[str, Any]] = []
    print(f"{params / 1e6:.2f}M parameters, vocab {tok.get_vocab_size()}")
    step, windows, tokens, start, data = 0, 0, 0, time.perf_counter(), iter(())
    while step < args.steps:
        nxt = next(data, None)
        if nxt is None:
            data = batches(window(windows, step), args.batch, pad, rng)
            windows += 1
            continue
        ids, labels = nxt
        ids, labels = ids.to(device), labels.to(device)
        tokens += ids.numel()
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        loss = weighted_loss(model(ids).logits, ids, labels, pad, args.context_loss)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        step += 1
        if step in (args.drills, args.drills + small_steps):
            data = iter(())  # the next phase starts with a fresh window
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            acc = {w: exact_match(model, enc) for w, enc in held_enc.items()}
            minutes = (time.perf_counter() - start) / 60
            row = {"step": step, "loss": loss.item(), "lr": lr, "minutes": minutes, "tokens": tokens, **acc}
            curves.append(row)
            print(json.dumps(row), flush=True)
            report = {"args": vars(args), "parameters": params, "curves": curves, "previous": previous}
            report = save(model, tok, Path(args.out), report)
    return report


def lineage(init: str | None) -> list[dict[str, Any]]:
    """The runs a continued checkpoint came from, oldest first, so its ``curves.json`` tells the whole story."""
    if not init or not (Path(init) / "curves.json").exists():
        return []
    report = json.loads((Path(init) / "curves.json").read_text())
    return [*report.get("previous", []), {k: v for k, v in report.items() if k != "previous"}]


def save(model, tok, out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint as it stands (written at every evaluation, so an interrupted run leaves one), with the
    bundled model's chat template, the format it was trained on."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.token_to_id(END)}))
    (out / "chat_template.jinja").write_text(bundled_template().templates["default"])
    (out / "curves.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hypic_rag.training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", type=int, default=4000, help="examples per workload the tokenizer learns from")
    parser.add_argument(
        "--mix",
        default=",".join(TRAIN_MIX),
        help="workloads and skill drills (hops, lists, keys, relations, company_relations); repeat to weigh",
    )
    parser.add_argument("--broad-recall", action="store_true", help="half the drills on full names and any value")
    parser.add_argument("--phrase-recall", action="store_true", help="a third of the drills on values of several words")
    parser.add_argument("--recall", type=float, default=0.25, help="share of each window that is recall drills")
    parser.add_argument(
        "--open-names",
        type=float,
        default=0.0,
        help="share of each workload's examples named with fresh words (names.TRAINING) instead of the pools",
    )
    parser.add_argument("--init", default=None, help="checkpoint to continue from (its tokenizer and config)")
    parser.add_argument(
        "--grow",
        action="store_true",
        help="grow the --init checkpoint to --hidden, --layers and --conv-kernel (same function)",
    )
    parser.add_argument("--eval-examples", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", default="linear_attention,full_attention,linear_attention,full_attention")
    parser.add_argument(
        "--conv-kernel", type=int, default=4, help="taps of the linear layers' causal conv (--grow may lengthen it)"
    )
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--questions", type=int, default=1, help="question-answer pairs per training example")
    parser.add_argument(
        "--curriculum", type=float, default=0.0, help="fraction of steps on small examples (fewer pieces) first"
    )
    parser.add_argument("--drills", type=int, default=0, help="first steps on dense key-value drills")
    parser.add_argument(
        "--sentences", type=float, default=0.0, help="share of each window that is dense relation-sentence drills"
    )
    parser.add_argument(
        "--copy", type=float, default=0.0, help="share of each window that is dense copying of made-up names"
    )
    parser.add_argument(
        "--sentence-lists", action="store_true", help="half the sentence drills list every key of a shared value"
    )
    parser.add_argument("--drill-spaces", action="store_true", help="a space token between drilled names")
    parser.add_argument("--attn-head-dim", type=int, default=64)
    parser.add_argument("--context-loss", type=float, default=0.0, help="loss weight of non-answer tokens")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda where a GPU is lent (bitwise repeatable on cpu only)"
    )
    run(parser.parse_args())


if __name__ == "__main__":
    main()
