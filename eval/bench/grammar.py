"""What an output grammar costs while decoding: tokens/s with and without a JSON-schema mask, side by side on
one engine, and the mask's own time per token (its share of a masked step).

    python -m hypic_rag.eval.bench.grammar --json docs/results/bench-grammar.json

Two models: the bundled one (its own tokenizer, a few thousand tokens) and a random-weight checkpoint with
Qwen3.5-0.8B's shapes (``--layers`` decoder layers, 24 as in the real model) and its 248,320-token vocabulary.
The mask's cost grows with the vocabulary (llguidance walks the tokenizer's trie for the bytes a JSON string may
hold next, and the allowed set is unpacked into a boolean row as wide as the logits), so the wide one is the case
that matters; with no hub here, its tokenizer is a byte-level vocabulary of that size made up of random words
(``wide_tokenizer``), whose trie is as large as a real one's.

Each prompt is decoded twice, alternately: free, and under ``response_format`` ``json_schema`` (an object with
one free string, so a random model keeps writing inside it; a free answer's stop ids are cleared, so it runs to
``--max-new-tokens`` too). Decode tokens/s is the tokens after the first over the time of the steps that
produced them. The mask's time is then measured alone: the masked run's tokens are
replayed through a fresh ``GrammarMask`` (``apply`` on a logits row of the model's width, then ``advance``), with
no model in the loop; its share is that time over the masked step's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine, Segment
from hypic_rag.grammar import SPACED, GrammarMask, check_response_format, response_lark

from ..data.corpus import corpus
from .common import RandomSegments, layer_shapes

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
    """A byte-level BPE ``tokenizer.json`` of ``vocab_size`` tokens (the 256 bytes, ``SPECIALS``, then random
    words of 2-12 letters, digits and punctuation, half of them after a space) and the files an engine reads
    with it. No merges: the benchmark never encodes text, it only needs the vocabulary llguidance walks."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?-_()[]{}/=+*&%$#@"
    rng = random.Random(seed)
    words: set[str] = set()
    room = vocab_size - len(vocab) - len(SPECIALS)
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


def _decode(engine: Engine, prompt: tuple[list[Segment], Segment], max_new_tokens: int, masked: bool) -> tuple:
    """One request's decode steps after its first token: (seconds, tokens decoded, every token id)."""
    extra = {"response_format": RESPONSE_FORMAT} if masked else {}
    run = engine.start(*prompt, max_new_tokens=max_new_tokens, temperature=0.0, **extra)
    if not masked:  # the same number of steps as a masked answer that runs on: no stop ends a free one
        run.decoder.stops = frozenset()
    start = time.perf_counter()
    out = run.run()
    seconds = time.perf_counter() - start
    return seconds, max(len(out.token_ids) - 1, 0), list(out.token_ids)


def _replay(engine: Engine, tokens: list[int], repeats: int = 3) -> float:
    """Seconds per token of the mask alone on ``tokens``: ``apply`` on a row as wide as the logits, ``advance``."""
    tokenizer = engine.grammar_tokenizer()
    row = torch.zeros(engine.config.vocab_size)
    best = float("inf")
    for _ in range(repeats):
        mask = GrammarMask(tokenizer, LARK)
        start = time.perf_counter()
        for token in tokens:
            mask.apply(row)
            mask.advance(token)
        best = min(best, (time.perf_counter() - start) / max(len(tokens), 1))
    return best


def measure(
    engine: Engine, prompts: list[tuple[list[Segment], Segment]], max_new_tokens: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Free and masked decoding of each prompt, alternately, each first on every other prompt (after a warm-up of
    each), and the mask replayed."""
    _decode(engine, prompts[0], 4, False)
    _decode(engine, prompts[0], 4, True)
    totals = {False: [0.0, 0], True: [0.0, 0]}
    replays = []
    for i, prompt in enumerate(prompts):
        for masked in (False, True) if i % 2 == 0 else (True, False):  # neither always runs first
            seconds, n, tokens = _decode(engine, prompt, max_new_tokens, masked)
            totals[masked][0] += seconds
            totals[masked][1] += n
            if masked:
                replays.append(_replay(engine, tokens))
                if len(tokens) < max_new_tokens:  # a finished answer parses, or the grammar did not hold
                    json.loads(engine.decode(tokens))
        log(f"  prompt {i + 1}/{len(prompts)}")
    free_rate = totals[False][1] / totals[False][0]
    masked_rate = totals[True][1] / totals[True][0]
    mask_ms = 1000 * statistics.median(replays)
    return {
        "decode_tokens_per_s": round(free_rate, 2),
        "masked_decode_tokens_per_s": round(masked_rate, 2),
        "masked_vs_free": round(masked_rate / free_rate, 3),
        "tokens": {"free": totals[False][1], "masked": totals[True][1]},
        "mask_ms_per_token": round(mask_ms, 3),
        "mask_share_of_masked_step": round(mask_ms / (1000 / masked_rate), 4),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="prompts per model")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--layers", type=int, default=24, help="decoder layers of the Qwen3.5-0.8B-shaped model")
    parser.add_argument("--no-wide", action="store_true", help="the bundled model only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = run(args.n, args.max_new_tokens, args.layers, not args.no_wide, args.seed)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
