"""What an output grammar costs while decoding: tokens/s with and without a JSON-schema mask, side by side on
one engine, and the mask's own time per token (its share of a masked step).

    python -m hypic_rag.eval.bench.grammar --json docs/results/bench-grammar.json

Two models: the bundled one (its own tokenizer, a few thousand tokens) and a random-weight checkpoint with
Qwen3.5-0.8B's shapes (``--layers`` decoder layers, 24 as in the real model) and its 248,320-token vocabulary.
The mask's cost grows with the vocabulary (llguidance walks the tokenizer's trie for the bytes a JSON string may
hold next, and the allowed set is unpacked into a boolean row as wide as the logits), so the wide one is the case
that matters; with no hub here, its tokenizer is a byte-level vocabulary of that size made up of random words
(``wide_tokenizer``), whose trie is as large as a real one's.

Each prompt is decoded twice in lockstep, a step of one then a step of the other: free, and under
``response_format`` ``json_schema`` (an object with one free string, so a random model keeps writing inside it;
a free answer's stop ids are cleared, so it runs to ``--max-new-tokens`` too). On a shared machine whatever else
runs slows both alike, so their ratio holds where the seconds do not. Decode tokens/s is the decode steps over
their time.

The mask's own time is measured beside them (``Replay``): each token the masked run chose is replayed through a
fresh ``GrammarMask`` (``apply`` on a logits row of the model's width, then ``advance``) with no model in the
loop, each mask computed when asked, so this is all the mask's work (in decoding most of it runs on a worker
thread while the forward does: ``GrammarMask.prefetch``); its share is that time over a masked step's. Beside
it, the floor: llguidance alone on the same grammar and tokens (its mask into a packed buffer, then the token),
``library_mask_ms_per_token``. Both replays run right after a decode step, each after the free and the masked
one in turn, as a mask in decoding finds the caches a forward has just swept; ``back_to_back`` replays both
again with nothing between tokens, as the library's own benchmarks run. ``extra_share_of_masked_step`` is the
other reading: what a masked step costs beyond a free one, over the masked step.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine, Segment
from hypic_rag.decoding import Generation, step_together
from hypic_rag.grammar import SPACED, GrammarMask, check_response_format, response_lark
from hypic_rag.masking import words_for

from ..data.corpus import corpus
from .common import RandomSegments, layer_shapes, write_report

# An answer the grammar holds to a JSON object with one free string: the mask is computed on every step.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
LARK = "start: " + response_lark(check_response_format(RESPONSE_FORMAT) or {}, SPACED)  # what the engine builds
SPECIALS = ("<|endoftext|>", "<|im_end|>")


def wide_tokenizer(path: Path, vocab_size: int, seed: int = 0) -> None:
    """A byte-level BPE ``tokenizer.json`` of ``vocab_size`` tokens (``SPECIALS``, the 256 bytes, then random
    words of 2-12 letters, digits and punctuation, half of them after a space) and the files an engine reads
    with it. No merges: the benchmark never encodes text, it only needs the vocabulary llguidance walks."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    # The specials first, at the pad and EOS ids random checkpoints' configs name (0 and 1), then the bytes.
    vocab = {token: i for i, token in enumerate([*SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?-_()[]{}/=+*&%$#@"
    rng = random.Random(seed)
    words: set[str] = set()
    room = vocab_size - len(vocab)
    while len(words) < room:
        word = "".join(rng.choices(letters, k=rng.randint(2, 12)))
        words.add(("Ġ" if rng.random() < 0.5 else "") + word)
    for word in sorted(words):
        vocab[word] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIALS[1], "pad_token": SPECIALS[0]}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    eos = [tok.token_to_id(s) for s in SPECIALS]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))


def wide_engine(layers: int, log: Callable[[str], None]) -> Engine:
    """A random checkpoint with Qwen3.5-0.8B's shapes, ``layers`` layers and its vocabulary, with ``wide_tokenizer``."""
    from hypic_rag.testing.synthetic import build_checkpoint

    shapes = layer_shapes(layers)
    log(f"random qwen3_5_text: hidden {shapes['hidden_size']}, {layers} layers, vocabulary {shapes['vocab_size']}")
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint("qwen3_5_text", tmp, shapes, seed=0)
        wide_tokenizer(Path(tmp), shapes["vocab_size"])
        return Engine.from_pretrained(tmp)


def _start(engine: Engine, prompt: tuple[list[Segment], Segment], max_new_tokens: int, masked: bool) -> Generation:
    extra = {"response_format": RESPONSE_FORMAT} if masked else {}
    run = engine.start(*prompt, max_new_tokens=max_new_tokens, temperature=0.0, **extra)
    if not masked:  # as many steps as a masked answer that runs on: no stop ends a free one
        run.decoder.stops = frozenset()
    return run


def _timed_step(run: Generation) -> float:
    start = time.perf_counter()
    step_together([run.decoder])
    return time.perf_counter() - start


class Replay:
    """The masked run's tokens replayed with no model in the loop, through ``GrammarMask`` (``apply`` on a logits
    row of the model's width, handed over as a decode step hands it, then ``advance``; each mask computed when
    asked) or through llguidance alone (its mask into a packed buffer, then the token): their seconds."""

    def __init__(self, engine: Engine, ours: bool) -> None:
        tokenizer = engine.grammar_tokenizer()
        self.ours, self.done, self.seconds = ours, 0, 0.0
        self.mask = GrammarMask(tokenizer, LARK) if ours else None
        self.library = None if ours else tokenizer.matcher(LARK)
        self.words = torch.empty(words_for(tokenizer.vocab_size), dtype=torch.int32)
        self.row = torch.zeros(engine.config.vocab_size)

    def catch_up(self, tokens: list[int]) -> None:
        for token in tokens[self.done :]:
            if self.mask is not None:
                scratch = self.row.clone()  # outside the time, as the decoder's own row
                begin = time.perf_counter()
                self.mask.apply(scratch, scratch=True)
                self.mask.advance(token)
            else:
                begin = time.perf_counter()
                self.library.unsafe_compute_mask_ptr(self.words.data_ptr(), self.words.numel() * 4)
                self.library.consume_token(token)
            self.seconds += time.perf_counter() - begin
        self.done = len(tokens)


def lockstep(engine: Engine, prompt: tuple[list[Segment], Segment], max_new_tokens: int) -> dict[str, Any]:
    """One prompt decoded free and masked in lockstep (a step of one, then of the other, in turns that swap each
    time), the masked run's tokens replayed through our mask and through llguidance alone right after a step
    (each after the other step in turn: both find the caches as a forward leaves them), then both again back
    to back, as the library's own benchmarks run. Seconds and decode steps of each, and the masked answer."""
    free, masked = _start(engine, prompt, max_new_tokens, False), _start(engine, prompt, max_new_tokens, True)
    picked = masked.decoder.picker.picked
    replays = [Replay(engine, ours=True), Replay(engine, ours=False)]
    seconds = {"free": 0.0, "masked": 0.0}
    turn = 0
    while not (free.done and masked.done):
        runs = [("free", free), ("masked", masked)][:: 1 if turn % 2 == 0 else -1]
        for (name, run), replay in zip(runs, replays[:: 1 if turn % 4 < 2 else -1], strict=True):
            if not run.done:
                seconds[name] += _timed_step(run)
            replay.catch_up(picked)
        turn += 1
    seconds["mask"], seconds["library"] = replays[0].seconds, replays[1].seconds
    for ours in (True, False):  # back to back
        replay = Replay(engine, ours)
        replay.catch_up(picked)
        seconds["mask_back_to_back" if ours else "library_back_to_back"] = replay.seconds
    steps = {"free": len(free.decoder.picker.picked) - 1, "masked": len(picked) - 1}
    return {"seconds": seconds, "steps": steps, "tokens": list(masked.output().token_ids)}


def measure(
    engine: Engine, prompts: list[tuple[list[Segment], Segment]], max_new_tokens: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Every prompt in lockstep (after a short warm-up); decode tokens/s free and masked, the mask's time."""
    lockstep(engine, prompts[0], 4)
    seconds = dict.fromkeys(("free", "masked", "mask", "library", "mask_back_to_back", "library_back_to_back"), 0.0)
    steps = {"free": 0, "masked": 0}
    for i, prompt in enumerate(prompts):
        one = lockstep(engine, prompt, max_new_tokens)
        for key in seconds:
            seconds[key] += one["seconds"][key]
        for key in steps:
            steps[key] += one["steps"][key]
        if len(one["tokens"]) < max_new_tokens:  # a finished answer parses, or the grammar did not hold
            json.loads(engine.decode(one["tokens"]))
        log(f"  prompt {i + 1}/{len(prompts)}")
    free_rate, masked_rate = steps["free"] / seconds["free"], steps["masked"] / seconds["masked"]
    replayed = steps["masked"] + 1  # the first token too, chosen with the prefill
    mask_ms = 1000 * seconds["mask"] / replayed
    library_ms = 1000 * seconds["library"] / replayed
    warm_ms = 1000 * seconds["mask_back_to_back"] / replayed
    warm_library_ms = 1000 * seconds["library_back_to_back"] / replayed
    return {
        "decode_tokens_per_s": round(free_rate, 2),
        "masked_decode_tokens_per_s": round(masked_rate, 2),
        "masked_vs_free": round(masked_rate / free_rate, 3),
        "steps": steps,
        "step_ms": {"free": round(1000 / free_rate, 3), "masked": round(1000 / masked_rate, 3)},
        "mask_ms_per_token": round(mask_ms, 3),
        "library_mask_ms_per_token": round(library_ms, 4),
        "mask_over_library": round(mask_ms / library_ms, 2),
        "back_to_back": {
            "mask_ms_per_token": round(warm_ms, 4),
            "library_mask_ms_per_token": round(warm_library_ms, 4),
            "mask_over_library": round(warm_ms / warm_library_ms, 2),
        },
        "mask_share_of_masked_step": round(mask_ms * masked_rate / 1000, 4),
        # what the masked step costs beyond the free one, as a share of it (the mask's work and whatever it
        # takes from the forward, e.g. llguidance's threads competing for the cores)
        "extra_share_of_masked_step": round(1 - masked_rate / free_rate, 4),
        "vocab_size": engine.config.vocab_size,
    }


def bundled_prompts(n: int, seed: int) -> tuple[Engine, list[tuple[list[Segment], Segment]]]:
    """The bundled model, and ``n`` of its own prompts: three documents of the synthetic world and a question."""
    from hypic_rag.chat.formats.bundled import ANSWER, QUESTION_TAG

    engine = Engine.from_pretrained()
    texts, qa = corpus(16, seed=seed)
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        docs = [Segment(f"<doc>{t}</doc>\n") for t in rng.sample(texts, 3)]
        prompts.append((docs, Segment(f"{QUESTION_TAG}{qa[i][0]}</q>\n{ANSWER}", kind="query")))
    return engine, prompts


def run(
    n: int = 8,
    max_new_tokens: int = 48,
    layers: int = 24,
    wide: bool = True,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    torch.manual_seed(seed)
    report: dict[str, Any] = {
        "config": {"n": n, "max_new_tokens": max_new_tokens, "layers": layers, "threads": torch.get_num_threads()},
        "schema": SCHEMA,
    }
    log("bundled model")
    engine, prompts = bundled_prompts(n, seed)
    report["bundled"] = measure(engine, prompts, max_new_tokens, log)
    log(json.dumps(report["bundled"]))
    if wide:
        engine = wide_engine(layers, log)
        random_prompts = RandomSegments(engine.config.vocab_size, seed)
        prompts = [(random_prompts.segments(2, 64), random_prompts.segment(16, "query")) for _ in range(n)]
        report["qwen3_5_0_8b_shapes"] = measure(engine, prompts, max_new_tokens, log)
        log(json.dumps(report["qwen3_5_0_8b_shapes"]))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="prompts per model")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--layers", type=int, default=24, help="decoder layers of the Qwen3.5-0.8B-shaped model")
    parser.add_argument("--no-wide", action="store_true", help="the bundled model only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.n, args.max_new_tokens, args.layers, not args.no_wide, args.seed)
    if args.json:
        write_report(report, args.json, "grammar")


if __name__ == "__main__":
    main()
