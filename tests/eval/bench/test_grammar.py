"""The grammar benchmark: its made-up wide vocabulary is one llguidance can read and hold an answer to, and a
short run on the bundled model decodes both ways in lockstep, replaying the masked run's every token."""

from __future__ import annotations

import json

from tokenizers import Tokenizer

from hypic_rag.eval.bench.grammar import LARK, SPECIALS, bundled_prompts, measure, wide_tokenizer
from hypic_rag.grammar import GrammarMask, GrammarTokenizer


def test_the_wide_tokenizer_has_the_size_asked_and_a_grammar_reads_it(tmp_path):
    wide_tokenizer(tmp_path, 5000, seed=1)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 5000
    eos = json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [tok.token_to_id(s) for s in SPECIALS]
    mask = GrammarMask(GrammarTokenizer(tok, 5000, eos), LARK)
    first = mask.allowed()
    assert first[tok.token_to_id("{")] and int(first.sum()) < 5000 // 10  # an object opens the answer
    for text in ('{"', 'answer": "'):
        for token in tok.encode(text).ids:
            mask.advance(token)
    inside = mask.allowed()  # inside the free string most words may come next
    assert int(inside.sum()) > 5000 // 2 and not inside[eos].any()


def test_a_short_run_on_the_bundled_model():
    engine, prompts = bundled_prompts(1, seed=0)
    report = measure(engine, prompts, max_new_tokens=6, log=lambda _: None)
    assert report["steps"] == {"free": 5, "masked": 5}  # both ran on to the limit
    assert report["decode_tokens_per_s"] > 0 and report["masked_decode_tokens_per_s"] > 0
    assert 0 < report["mask_share_of_masked_step"] < 1 and report["vocab_size"] == engine.config.vocab_size
    # both are timed; which is smaller is the benchmark's finding, not a property (a busy machine reorders them)
    assert report["library_mask_ms_per_token"] > 0 and report["mask_ms_per_token"] > 0
