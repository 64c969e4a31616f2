"""The training script: reproducible from one command, and its checkpoint serves in both runtimes."""

from __future__ import annotations

import argparse
import json

import torch
from safetensors.torch import load_file

from hypic_rag import Engine
from hypic_rag.eval.train import HELD_OUT_SEED, SPECIALS, TRAIN_MIX, fresh_window, kv_drills, make, recall_examples, run
from hypic_rag.testing.parity import load_reference, logits_max_diff


def _args(out) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out), steps=3, seed=0, examples=30, eval_examples=2, eval_every=3, vocab=400, hidden=64,
        layers="linear_attention,full_attention", max_len=640, batch=2, lr=3e-3, warmup=2, questions=2,
        context_loss=0.3, threads=0, attn_head_dim=32, curriculum=0.0, recall=0.25,
        init=None, drills=0, drill_spaces=False, mix=",".join(TRAIN_MIX), broad_recall=False,
    )  # fmt: skip


def test_training_is_reproducible_and_the_checkpoint_loads_everywhere(tmp_path):
    report = run(_args(tmp_path / "a"))
    run(_args(tmp_path / "b"))
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in report["curves"]] == [3]
    engine = Engine.from_pretrained(tmp_path / "a")
    assert all(len(engine.encode(tag)) == 1 for tag in SPECIALS)
    assert engine.eos_token_ids == (engine.tokenizer.token_to_id("</a>"),)
    ids = torch.randint(0, engine.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    assert logits_max_diff(engine.model, load_reference(tmp_path / "a"), ids) < 1e-4


def test_training_continues_from_a_checkpoint(tmp_path):
    run(_args(tmp_path / "a"))
    args = _args(tmp_path / "b")
    args.init, args.steps, args.eval_every = str(tmp_path / "a"), 1, 1
    run(args)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # one more step was taken
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    report = json.loads((tmp_path / "b" / "curves.json").read_text())
    assert [r["args"]["out"] for r in report["previous"]] == [str(tmp_path / "a")]  # the lineage is kept


def _texts(examples):
    return {"".join(s.text or "" for s in ex.segments) + ex.query for ex in examples}


def test_training_windows_never_repeat_and_never_meet_the_held_out_examples():
    first, second = fresh_window(0, 64, 0, False, 0.25), fresh_window(1, 64, 0, False, 0.25)
    assert len(first) == 64 and sum(ex.query.endswith("?") and len(ex.segments) == 1 for ex in first) >= 16
    held = _texts(recall_examples(50, HELD_OUT_SEED))
    for w in ("single_doc", "tool_call", "memory"):
        held |= _texts(make(w, 50, HELD_OUT_SEED))
    assert not _texts(first) & _texts(second) and not (_texts(first) | _texts(second)) & held


def test_kv_drills_ask_each_key_again_and_label_only_its_value():
    from tokenizers import Tokenizer

    from hypic_rag.engine import default_model_path

    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    space = tok.encode(" ", add_special_tokens=False).ids
    for spaced in (False, True):
        for ids, labels in kv_drills(tok, 20, seed=5, spaced=spaced):
            words = [i for i in ids if i not in space] if spaced else ids
            assert len(ids) == len(labels) and len(words) == (len(ids) // 2 if spaced else len(ids))
            half = len(words) // 2
            first = dict(zip(words[:half:2], words[1:half:2], strict=True))
            assert sorted(words[half::2]) == sorted(first)  # every key asked once more
            asked = [(ids[i - (2 if spaced else 1)], ids[i]) for i, lab in enumerate(labels) if lab != -100]
            assert len(asked) == len(first) and all(first[k] == v for k, v in asked)


def test_recall_drills_answer_from_their_document():
    for broad in (False, True):
        examples = recall_examples(30, seed=4, broad=broad)
        values = set()
        for ex in examples:
            text = ex.segments[0].text
            for question, answer in ex.meta["qa"]:
                assert f"{question[:-1]} {answer}." in text  # the pair the question asks about
                assert len(question[:-1].split()) == (2 if broad else 1)
                values.add(answer)
        assert any(v.isdigit() for v in values) == broad and any(" " in v for v in values) == broad
