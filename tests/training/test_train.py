"""The training script: reproducible from one command, and its checkpoint serves in both runtimes."""

from __future__ import annotations

import hashlib
import json
import random
import re

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from hypic_rag import Engine
from hypic_rag.chat.formats.bundled import bundled_template
from hypic_rag.eval.data.workloads import make, render
from hypic_rag.model.loading import default_model_path
from hypic_rag.testing.parity import assert_matches_transformers
from hypic_rag.training import train
from hypic_rag.training.drills import recall_examples
from hypic_rag.training.train import HELD_OUT_SEED, encode, fresh_window, parse_mix, run, special_tokens

# sha256 of training ids and labels (``test_training_ids_are_todays``) and of the tokenizer's training
# texts, first computed on the code that wrapped each segment by hand, before the examples became messages;
# changed twice since, on purpose: with the workloads' digests (a person's description gained a profile form),
# then when multi_hop answers gained their reasoning (without it the digest is the one before, 1aa22c35...).
ENCODE_DIGEST = "939cce8dac236c2b9ce3f2f32c2aa7feea9ff906f985132407de542a21d133d4"
TEXTS_DIGEST = "e3151c50f76641091d706536b05b5f120bae988924cf4a1361ce59a83dfefa2c"


def test_training_is_reproducible_and_the_checkpoint_loads_everywhere(tmp_path, train_args):
    report = run(train_args(tmp_path / "a"))
    run(train_args(tmp_path / "b"))
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in report["curves"]] == [3]
    engine = Engine.from_pretrained(tmp_path / "a")
    assert all(len(engine.encode(tag)) == 1 for tag in special_tokens())
    assert engine.eos_token_ids == (engine.tokenizer.token_to_id("</a>"),)
    # the checkpoint carries the format it was trained on, so Engine.chat serves it as training saw it
    assert (tmp_path / "a" / "chat_template.jinja").read_text() == bundled_template().templates["default"]
    ex = make("tool_call", 1, 3)[0]
    assert engine.render(ex.messages, ex.tools).segments == render(ex).segments
    ids = torch.randint(0, engine.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    assert_matches_transformers(engine.model, tmp_path / "a", ids)


def test_training_continues_from_a_checkpoint(tmp_path, train_args):
    run(train_args(tmp_path / "a"))
    args = train_args(tmp_path / "b")
    args.init, args.steps, args.eval_every, args.sentences, args.copy = str(tmp_path / "a"), 1, 1, 0.5, 0.25
    run(args)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # one more step was taken
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    report = json.loads((tmp_path / "b" / "curves.json").read_text())
    assert [r["args"]["out"] for r in report["previous"]] == [str(tmp_path / "a")]  # the lineage is kept
    # the dense drills are scored held out, copying by every held-out namer beside the held-out split
    held = {"sentences", "copy", "copy:greek", "copy:han", "open_single_doc", "open_multi_doc"}
    assert held <= report["curves"][-1].keys()


def test_the_special_tokens_are_the_templates_tags_in_the_bundled_tokenizers_order():
    tags = ["sys", "doc", "tool", "mem", "turn", "q"]
    assert special_tokens() == ["<pad>", "</a>", "<a>", *(f"<{t}>" for t in tags), *(f"</{t}>" for t in tags)]
    bundled = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    assert [bundled.id_to_token(i) for i in range(len(special_tokens()))] == special_tokens()


def test_training_ids_are_todays():
    """Each segment encoded on its own through the template, then each question, answer and EOS: the same ids
    and labels as when the segments were wrapped by hand, augmentation and extra questions included."""
    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    h = hashlib.sha256()
    for k in range(3):
        for small in (False, True):
            exs = fresh_window(k, 96, 6, small, 0.3, (*train.TRAIN_MIX, "agent"), True)
            augment = random.Random(f"augment:{k}")
            for ex in exs:
                for questions in (1, 16):
                    h.update(json.dumps(encode(tok, ex, questions, augment)).encode())
            for ex in exs[:20]:
                h.update(json.dumps(encode(tok, ex)).encode())
    assert h.hexdigest() == ENCODE_DIGEST
    h = hashlib.sha256()
    for text in train.texts([ex for w in train.TRAIN_MIX for ex in make(w, 30, 0)]):
        h.update(text.encode() + b"\0")
    assert h.hexdigest() == TEXTS_DIGEST


def _texts(examples):
    return {"".join(s.text or "" for s in ex.segments) + ex.query for ex in examples}


def test_training_windows_never_repeat_and_never_meet_the_held_out_examples():
    first, second = fresh_window(0, 64, 0, False, 0.25), fresh_window(1, 64, 0, False, 0.25)
    assert len(first) == 64 and sum(ex.query.endswith("?") and len(ex.segments) == 1 for ex in first) >= 16
    held = _texts(recall_examples(50, HELD_OUT_SEED))
    for w in ("single_doc", "tool_call", "memory"):
        held |= _texts(make(w, 50, HELD_OUT_SEED))
    assert not _texts(first) & _texts(second) and not (_texts(first) | _texts(second)) & held


def test_a_missing_device_is_a_clear_error(tmp_path, train_args):
    args = train_args(tmp_path / "a")
    args.device = "cuda" if not torch.cuda.is_available() else "nonsense"
    with pytest.raises(ValueError, match="device"):
        run(args)


@pytest.mark.parametrize(
    ("sentences", "lists", "copy", "match"),
    [
        (1.5, False, 0.0, "from 0 to 1"),
        (0.0, True, 0.0, "--sentences"),
        (0.5, False, 0.6, "--copy .* less --sentences"),
    ],
)
def test_dense_drill_options_out_of_range_are_clear_errors(tmp_path, train_args, sentences, lists, copy, match):
    args = train_args(tmp_path / "a")
    args.sentences, args.sentence_lists, args.copy = sentences, lists, copy
    with pytest.raises(ValueError, match=match):
        run(args)
    assert not (tmp_path / "a").exists()  # refused before any work


def test_an_init_that_is_no_checkpoint_is_a_clear_error(tmp_path, train_args):
    args = train_args(tmp_path / "a")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    for init in (tmp_path / "missing", tmp_path / "half"):  # a typo'd run name; a run without its tokenizer
        args.init = str(init)
        with pytest.raises(ValueError, match="--init .*not a checkpoint directory"):
            run(args)


def test_a_mix_takes_skill_drills_by_name_and_refuses_unknown_names():
    assert parse_mix("single_doc,hops,hops,lists") == ("single_doc", "hops", "hops", "lists")
    window = fresh_window(0, 60, 0, False, 0.0, parse_mix("hops,hops,lists"))
    hops = [ex for ex in window if "headquartered" in ex.query]
    lists = [ex for ex in window if ex.query.endswith("List every name.")]
    assert len(hops) == 40 and len(lists) == 20
    facts = (" works at ", " is headquartered in ", " lives in ")
    assert all(any(f in s.text for f in facts) for ex in hops for s in ex.segments)
    with pytest.raises(ValueError, match="'hop'.*expected names from"):
        parse_mix("single_doc,hop")
    with pytest.raises(ValueError, match="'open_multi_doc' is the held-out split, scored and never trained on"):
        parse_mix("single_doc,open_multi_doc")


def test_a_window_names_a_share_of_each_workload_with_fresh_words():
    from hypic_rag.eval.data.pools import FIRST_NAMES

    pooled = re.compile(r"\b(" + "|".join(FIRST_NAMES) + r")\b")
    for share, fresh in ((0.0, 0), (0.5, 10), (1.0, 20)):
        window = fresh_window(0, 40, 0, False, 0.0, ("single_doc", "memory"), open_names=share)
        texts = ["".join(s.text for s in ex.segments) for ex in window if ex.workload == "single_doc"]
        assert len(texts) == 20 and sum(not pooled.search(t) for t in texts) == fresh
    # the tool-call drill takes fresh words too (half of its 10 here); small talk has no names to take
    from hypic_rag.training.drills import literal_call_examples

    answers = {
        ex.answers[0] for ex in fresh_window(0, 20, 0, False, 0.0, ("literal_calls", "small_talk"), open_names=0.5)
    }
    for names in ("pools", "open"):
        assert {ex.answers[0] for ex in literal_call_examples(5, 100_000_000, names=names)} <= answers
    assert parse_mix("single_doc,framework_qa") == ("single_doc", "framework_qa")  # a scored workload not in v4's mix
    window = fresh_window(0, 12, 0, False, 0.0, ("framework_qa",))
    assert len(window) == 12 and all("framework_qa" in ex.meta["id"] for ex in window)


def test_a_multi_hop_answer_is_trained_after_its_reasoning_and_others_without():
    from hypic_rag.chat.tool_calls import parse_output

    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    for workload in ("multi_hop", "single_doc"):
        for ex in make(workload, 10, 4):
            ids, labels = encode(tok, ex, questions=16, rng=random.Random(0))
            targets = [i for i, lab in zip(ids, labels, strict=True) if lab != -100]
            answers = tok.decode(targets, skip_special_tokens=False).split("</a>")[:-1]
            assert len(answers) == min(16, len(ex.meta["qa"]))
            for (question, answer), target in zip(ex.meta["qa"][:16], answers, strict=True):
                parsed = parse_output(target, "bundled")
                assert parsed.content == answer  # what the harness scores, reasoning split off
                thought = ex.meta.get("reasoning", {}).get(question)
                assert parsed.reasoning == thought and (thought is None) == (workload != "multi_hop")


def test_a_completions_route_example_trains_on_the_flat_prompt_that_route_serves():
    """No chat template: the route's own segments (``prompt_segments``), each encoded on its own, then the answer
    and the EOS, the only tokens with a loss."""
    from hypic_rag.server.completions import prompt_segments

    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    flat = [ex for ex in make("framework_qa", 40, 2) if "completion" in ex.meta]
    assert flat
    for ex in flat:
        ids, labels = encode(tok, ex, questions=16, rng=random.Random(0))
        segments, query = prompt_segments(ex.meta["completion"])
        prompt = [i for s in [*segments, query] for i in tok.encode(s.text, add_special_tokens=False).ids]
        answer = tok.encode(ex.answers[0], add_special_tokens=False).ids + [tok.token_to_id("</a>")]
        assert ids == prompt + answer and labels == [-100] * len(prompt) + answer
