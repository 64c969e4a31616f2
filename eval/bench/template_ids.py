"""How often a segmented chat prompt's ids differ from the tokenizer's ids of the same rendered text.

    python -m hypic_rag.eval.bench.template_ids --template hypic_rag/testing/templates/qwen3.jinja --json ids.json

Every mode serves the concatenation of each segment's own ids (so a segment is the same ids wherever
it appears); ``full`` over a chat prompt therefore runs those ids, not ``tokenizer.encode(text)``. The
two differ where a tokenizer merge would cross a cut. This counts, per template and prompt style,
the prompts whose ids differ and the tokens the cuts add (each merge a cut prevents adds at least
one). The bundled model's template uses the bundled tokenizer; other templates use a Qwen-style
byte-level BPE that ``testing.synthetic.add_chat_files`` trains on the corpus (``--vocab`` tokens).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypic_rag.chat.segmentation import segment_prompt
from hypic_rag.chat.template import ChatTemplate
from hypic_rag.model.loading import default_model_path
from hypic_rag.tokenizer import load_tokenizer

from ..data.corpus import corpus
from .common import write_report

STYLES = ("explicit_parts", "explicit_spaced", "flat_rag", "multi_turn")


def _conversation(style: str, rng: random.Random, texts: list[str], qa: list[tuple[str, str]]) -> list[dict]:
    docs = rng.sample(texts, rng.randint(2, 6))
    question = rng.choice(qa)[0]
    if style in ("explicit_parts", "explicit_spaced"):
        end = " " if style == "explicit_spaced" else ""  # parts that carry their own separator
        parts = [{"type": "text", "text": d + end, "hypic": {"kind": "document"}} for d in docs]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]
    if style == "flat_rag":
        context = "\n\n".join(docs)
        user = f"Answer the question based only on the following context:\n{context}\n\nQuestion: {question}"
        return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]
    earlier = rng.choice(qa)
    return [
        {"role": "system", "content": "Answer from the documents. " + " ".join(docs)},
        {"role": "user", "content": earlier[0]},
        {"role": "assistant", "content": earlier[1]},
        {"role": "user", "content": question},
    ]


def measure(
    template: ChatTemplate, tokenizer: Any, n: int = 100, seed: int = 0, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    texts, qa = corpus(24, seed)
    rows = []
    for style in STYLES:
        rng = random.Random(f"{style}:{seed}")
        differ = tokens = extra = 0
        for _ in range(n):
            rendered = segment_prompt(template, _conversation(style, rng, texts, qa))
            pieces = [*rendered.segments, rendered.query]
            served = [i for s in pieces for i in tokenizer.encode(s.text, add_special_tokens=False).ids]
            whole = tokenizer.encode(rendered.text, add_special_tokens=False).ids
            differ += served != whole
            tokens += len(whole)
            extra += len(served) - len(whole)
        row = {"style": style, "prompts": n, "prompts_differing": differ, "tokens": tokens, "extra_tokens": extra}
        rows.append(row)
        log(f"  {style:<15} {differ}/{n} prompts differ; the cuts add {extra} tokens to {tokens}")
    return rows


def run(
    templates: list[Path], n: int = 100, seed: int = 0, vocab_size: int = 2000, log: Callable[[str], None] = print
) -> dict[str, Any]:
    report: dict[str, Any] = {"results": {}}
    bundled = default_model_path()
    log(f"bundled template, bundled tokenizer ({bundled})")
    report["results"]["bundled"] = measure(ChatTemplate.from_checkpoint(bundled), load_tokenizer(bundled), n, seed, log)
    from hypic_rag.testing.synthetic import add_chat_files

    texts, qa = corpus(24, seed)
    words = texts + [q for q, _ in qa] + [a for _, a in qa]
    for path in templates:
        source = path.read_text()
        with tempfile.TemporaryDirectory() as tmp:
            # A vocabulary large enough to merge a leading space into the word after it, as real ones do.
            tokenizer = load_tokenizer(add_chat_files(tmp, source, vocab_size=vocab_size, texts=words))
        log(f"{path.name}, Qwen-style byte-level BPE of {tokenizer.get_vocab_size()} tokens")
        report["results"][path.name] = measure(ChatTemplate(source, origin=str(path)), tokenizer, n, seed, log)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, action="append", default=[], help="a chat template file (repeat)")
    parser.add_argument("--n", type=int, default=100, help="prompts per style")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=2000, help="BPE vocabulary for the non-bundled templates")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.template, args.n, args.seed, args.vocab)
    if args.json:
        write_report(report, args.json, "template_ids")


if __name__ == "__main__":
    main()
