"""The recall drills: each key asked again, each answer in its own document, every word of it copied."""

from __future__ import annotations

from hypic_rag.eval.train.drills import kv_drills, recall_examples


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


def test_phrase_drills_need_every_word_copied():
    examples = recall_examples(40, seed=4, phrases=True)
    shared_brand = 0
    for ex in examples:
        text = ex.segments[0].text
        answers = [answer for _, answer in ex.meta["qa"]]
        for question, answer in ex.meta["qa"]:
            assert f"{question[:-1]} {answer}." in text and len(question[:-1].split()) == 2
            assert 2 <= len(answer.split()) <= 3  # no value is one word: the first word alone never scores
        firsts = [a.split()[0] for a in answers]
        shared_brand += any(len({a for a in answers if a.split()[0] == f}) > 1 for f in firsts)
    assert shared_brand >= 5  # documents where the first word does not tell the answer
    assert recall_examples(40, seed=4, phrases=True)[0].meta == examples[0].meta
    assert recall_examples(5, seed=4, phrases=True)[0].meta != recall_examples(5, seed=4, broad=True)[0].meta
