"""The training script: reproducible from one command, and its checkpoint serves in both runtimes."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from hypic_rag import Engine
from hypic_rag.eval.data.workloads import make
from hypic_rag.eval.train.drills import recall_examples
from hypic_rag.eval.train.train import HELD_OUT_SEED, SPECIALS, fresh_window, run
from hypic_rag.testing.parity import load_reference, logits_max_diff


def test_training_is_reproducible_and_the_checkpoint_loads_everywhere(tmp_path, train_args):
    report = run(train_args(tmp_path / "a"))
    run(train_args(tmp_path / "b"))
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in report["curves"]] == [3]
    engine = Engine.from_pretrained(tmp_path / "a")
    assert all(len(engine.encode(tag)) == 1 for tag in SPECIALS)
    assert engine.eos_token_ids == (engine.tokenizer.token_to_id("</a>"),)
    ids = torch.randint(0, engine.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    assert logits_max_diff(engine.model, load_reference(tmp_path / "a"), ids) < 1e-4


def test_training_continues_from_a_checkpoint(tmp_path, train_args):
    run(train_args(tmp_path / "a"))
    args = train_args(tmp_path / "b")
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
