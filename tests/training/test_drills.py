"""The drills: each key asked again, each answer in its own document, every word of it copied; two hops
that only the chain answers; lists that are every name and no other."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from tokenizers import Tokenizer

from hypic_rag.engine import default_model_path
from hypic_rag.eval.data.names import HELD_OUT
from hypic_rag.eval.data.pools import BRANDS, PLACES
from hypic_rag.training.drills import (
    RELATIONS,
    copy_drills,
    hop_examples,
    key_examples,
    kv_drills,
    list_examples,
    recall_examples,
    relation_examples,
    sentence_drills,
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """The bundled tokenizer, which the token-level drills encode with."""
    return Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))


def test_kv_drills_ask_each_key_again_and_label_only_its_value(tok):
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


def _sentences(ex):
    return [seg.text.strip().removeprefix("<doc>").removesuffix("</doc>") for seg in ex.segments]


def test_hop_drills_are_answered_only_by_chaining_two_documents():
    home_cities = 0
    for small in (False, True):
        examples = hop_examples(40, seed=3, small=small)
        for ex in examples:
            docs = _sentences(ex)
            employer = dict(re.fullmatch(r"(.+) works at (.+)\.", d).groups() for d in docs if " works at " in d)
            hq = dict(re.fullmatch(r"(.+) is headquartered in (.+)\.", d).groups() for d in docs if " headq" in d)
            home = dict(re.fullmatch(r"(.+) lives in (.+)\.", d).groups() for d in docs if " lives in " in d)
            assert len(docs) == len(employer) + len(hq) + len(home)  # one fact per document
            assert (2 <= len(employer) <= 3) if small else (3 <= len(employer) <= 6)
            assert len(set(hq.values())) == len(hq)  # the answer names its company: no shared HQ city
            assert len({org.split()[1] for org in hq}) <= 2  # companies told apart by their first word only
            assert {q for q, _ in ex.meta["qa"]} == {
                f"In which city is the company that employs {n} headquartered?" for n in employer
            } | {f"Where is {org} headquartered?" for org in hq}
            for question, answer in ex.meta["qa"]:
                if question.startswith("Where is "):  # the second hop alone
                    assert answer == hq[question.removeprefix("Where is ").removesuffix(" headquartered?")]
                    continue
                name = question.removeprefix("In which city is the company that employs ").split(" headq")[0]
                assert answer == hq[employer[name]] and answer != home.get(name)
            home_cities += bool(home)
    assert 20 <= home_cities <= 75  # a home city beside the HQs in some prompts, not all
    assert hop_examples(5, seed=3)[0].meta == hop_examples(5, seed=3)[0].meta != hop_examples(5, seed=4)[0].meta


def test_list_drills_list_every_name_of_a_city_in_document_order():
    for small in (False, True):
        for ex in list_examples(40, seed=3, small=small):
            homes = [re.fullmatch(r"(.+) lives in (.+)\.", d).groups() for d in _sentences(ex)]
            assert (3 <= len(homes) <= 5) if small else (5 <= len(homes) <= 10)
            assert len({c for _, c in homes}) <= 3
            asked = {q.removeprefix("Who lives in ").removesuffix("? List every name."): a for q, a in ex.meta["qa"]}
            assert set(asked) == {c for _, c in homes}
            for city, answer in asked.items():
                assert answer == ", ".join(n for n, c in homes if c == city)


def test_key_drills_key_on_companies_and_places_as_well_as_names():
    kinds, shared = set(), 0
    for ex in key_examples(40, seed=2):
        text = ex.segments[0].text
        lasts: dict[str, set[str]] = {}
        for question, answer in ex.meta["qa"]:
            key = question.removesuffix("?")
            assert f"{key} {answer}." in text and text.count(f"{key} ") == 1  # the pair asked about, once
            words = key.split()
            kinds.add("place" if words[0] in PLACES else "company" if words[0] in BRANDS else "name")
            if len(words) == 2:
                lasts.setdefault("company" if words[0] in BRANDS else "name", set()).add(words[1])
        assert all(len(last) == 1 for last in lasts.values())  # companies, and people, share a last word
        shared += sum(q.split()[0] in BRANDS for q, _ in ex.meta["qa"]) >= 2
    assert kinds == {"place", "company", "name"} and shared >= 5  # documents where the last word is no key
    assert key_examples(3, seed=2)[0].meta == key_examples(3, seed=2)[0].meta != key_examples(3, seed=3)[0].meta


def test_relation_drills_are_answered_only_by_the_key_read_across_its_relation():
    patterns = [
        (re.compile(re.escape(sentence).replace(r"\{k\}", "(.+)").replace(r"\{v\}", "(.+)")), forward, back)
        for relations in RELATIONS.values()
        for sentence, forward, back, _ in relations
    ]
    backwards = several = 0
    for small in (False, True):
        for ex in relation_examples(40, seed=4, small=small):
            facts = {}  # (relation's forward question, key) -> value
            for doc in _sentences(ex):
                (found,) = [(p, f, b, p.fullmatch(doc)) for p, f, b in patterns if p.fullmatch(doc)]
                _, forward, back, match = found
                facts[(forward, match[1])] = (match[2], back)
            keys = {k for _, k in facts}
            assert (2 <= len(keys) <= 3) if small else (3 <= len(keys) <= 6)
            assert len({k.split()[1] for k in keys}) == 1  # only the first word tells the keys apart
            expected_forward = {forward.format(k=k): v for (forward, k), (v, _) in facts.items()}
            values = [v for v, _ in facts.values()]
            expected_back = {back.format(v=v): k for (_, k), (v, back) in facts.items() if values.count(v) == 1}
            assert dict(ex.meta["qa"]) == expected_forward | expected_back  # every sentence asked
            assert ex.answers[0] == dict(ex.meta["qa"])[ex.query]
            backwards += bool(expected_back)
            several += any(sum(k == key for _, k in facts) > 1 for key in keys)  # a key in two relations
    assert backwards >= 60 and several >= 20
    assert relation_examples(3, seed=4)[0].meta == relation_examples(3, seed=4)[0].meta
    assert relation_examples(3, seed=4)[0].meta != relation_examples(3, seed=5)[0].meta


def test_company_relation_drills_key_on_companies_only():
    from hypic_rag.training.drills import SKILL_DRILLS

    for ex in SKILL_DRILLS["company_relations"](20, seed=4):
        for question, answer in ex.meta["qa"]:
            key = answer if question.startswith("Which company") else question
            assert any(word in BRANDS for word in key.split())
    assert SKILL_DRILLS["company_relations"](2, seed=4)[0].meta != relation_examples(2, seed=4)[0].meta


def test_the_probe_counts_each_relation_and_direction_apart():
    from hypic_rag.training.probe import by_form

    examples = relation_examples(30, seed=6)
    back = ("Which company", "Who lives", "Who works", "Who was born", "Who is married to")

    def forwards_only(ex, question):  # knows every value asked by key, no key asked by value
        return "nobody" if question.startswith(back) else dict(ex.meta["qa"])[question]

    counts = by_form(examples, forwards_only)
    asked = sum(min(4, len(ex.meta["qa"])) for ex in examples)
    assert sum(a for _, a in counts.values()) == asked
    for form, (right, total) in counts.items():
        assert right == (total if "{k}" in form else 0), form
    assert {"Where is {k} headquartered?", "Who lives in {v}?"} <= set(counts)


def test_key_shapes_change_only_the_words_of_the_keys():
    from hypic_rag.training.probe import KEY_WORDS, key_shapes

    seen = []

    def reads_people_only(ex, question):  # answers when the key's second word is a last name
        seen.append(ex)
        key = question.removeprefix("Where does ").removeprefix("Where is ").split(" live")[0].split(" headq")[0]
        doc = next(s.text for s in ex.segments if f"{key} " in s.text)
        return doc.split(" in ")[-1].split(".")[0] if key.split()[1] in KEY_WORDS["last name"] else "?"

    counts = key_shapes(reads_people_only, n=5)
    assert len(counts) == 8 and all(asked == 5 for _, asked in counts.values())
    for (_, second, _), (right, _) in counts.items():
        assert right == (5 if second == "last name" else 0)
    for ex in seen:
        keys = [s.text.split(" lives")[0].split(" is head")[0] for s in ex.segments if "<doc>" in s.text]
        assert len(keys) == 4 and len({k.split()[-1] for k in keys}) == 1 and len(set(keys)) == 4


def test_the_second_hop_probe_writes_the_first_hop_and_sorts_the_city_read():
    from hypic_rag.eval.data.workloads import make
    from hypic_rag.training.probe import second_hop

    examples = make("multi_hop", 12, 7)
    queries = []

    def reads(ex, query):  # right on the first four, another company's city on the next four, then a guess
        queries.append(query)
        i = len(queries) - 1
        if i < 4:
            return ex.answers[0]
        if i < 8:
            return next(t.rsplit(" in ", 1)[-1].rstrip(".") for t in ex.meta["reasoning"].values()
                        if not t.endswith(f" {ex.answers[0]}."))  # fmt: skip
        return "Nowhere"

    counts = second_hop(reads, n=12)
    assert counts == {"right": 4, "another company's city": 4, "other": 4}
    for ex, query in zip(examples, queries, strict=True):
        org = ex.meta["reasoning"][ex.query].split(" is headquartered in ")[0]
        assert ex.query in query
        assert query.endswith(f"<think>{org} is headquartered in ") and ex.answers[0] not in query


def test_sentence_drills_recall_each_value_forwards_and_each_value_back_with_every_key_it_has(tok):
    backs = [
        (re.escape(b).replace(re.escape("{v}"), "(.+)") + "( List every name\\.)? $", s)
        for rel in RELATIONS.values()
        for s, _, b, _ in rel
    ]
    listed = Counter()
    for lists in (False, True):
        for ids, labels in sentence_drills(tok, 200, seed=3, lists=lists):
            text = tok.decode(ids)
            assert tok.encode(text, add_special_tokens=False).ids == ids  # tokenized as the whole text is
            facts = [f + "." for f in text.split("\n")[0][:-1].split(". ")]
            assert len({f.split()[1] for f in facts}) == 1  # the keys share their last word
            spans = [i for i, lab in enumerate(labels) if lab != -100 and labels[i - 1] == -100]
            forwards = 0
            for start in spans:
                end = next((i for i in range(start, len(labels)) if labels[i] == -100), len(labels))
                answer = tok.decode(ids[start:end])
                query = re.split(r"(?<=\.)(?<!name\.) (?!List)", tok.decode(ids[:start]).split("\n")[1])[-1].lstrip()
                if query.endswith("? ") or query.endswith("name. "):  # a back question: every key of its value
                    ((value, sentence, many),) = (
                        (m.group(1), s, m.group(2)) for b, s in backs if (m := re.fullmatch(b, query))
                    )
                    keys = [f[: -len(sentence.format(k="", v=value))] for f in facts if f.endswith(f" {value}.")]
                    assert answer.split(", ") == keys and all(sentence.format(k=k, v=value) in facts for k in keys)
                    assert lists or (len(keys) == 1 and not many)  # without lists, unique values only
                    listed[len(keys) > 1] += 1
                else:
                    assert query + answer + "." in facts
                    forwards += 1
            assert forwards == len(facts)
    assert listed[True] > 10  # lists drill values shared by several keys
    for (held, held_labels), (ids, _) in zip(
        sentence_drills(tok, 5, 3, asked=1), sentence_drills(tok, 5, 3), strict=True
    ):
        assert ids[: len(held)] == held and sum(lab != -100 for lab in held_labels) > 0  # the first recall alone
        assert len(held) < len(ids)


def test_sentence_drills_with_lists_draw_enough_values_for_every_shape(tok):
    drills = sentence_drills(tok, 3000, seed=0, lists=True)  # two keys sharing three years broke a run
    assert len(drills) == 3000 and all(any(lab != -100 for lab in labels) for _, labels in drills)


def test_agent_memory_drills_put_other_peoples_notes_before_the_task():
    from hypic_rag.training.drills import agent_memory_examples
    from hypic_rag.training.train import parse_mix

    assert parse_mix("agent_memory") == ("agent_memory",)
    examples = agent_memory_examples(40, seed=2)
    for ex in examples:
        kinds = [s.kind for s in ex.segments]
        last = len(kinds) - 1 - kinds[::-1].index("memory")
        assert kinds.count("memory") in (1, 2) and "turn" not in kinds[:last]  # the notes come before the steps
        notes = [s.text for s in ex.segments if s.kind == "memory"]
        task = ex.messages[0]["content"][-1]["text"]
        named = [w for n in notes for w in re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", n)]
        assert not any(n in task or n in ex.answers[0] for n in named)  # the notes never name the task's person
    assert any("manager" in s.text for ex in examples for s in ex.segments)


@pytest.mark.parametrize("names", ["pools", "open"])
def test_literal_call_drills_call_with_what_only_the_question_holds(names):
    import json

    from hypic_rag.eval.data.pools import FIRST_NAMES, PLACES
    from hypic_rag.training.drills import literal_call_examples
    from hypic_rag.training.train import parse_mix

    assert parse_mix("literal_calls") == ("literal_calls",)
    examples = literal_call_examples(200, seed=3, names=names)
    pooled = set(FIRST_NAMES) | set(PLACES)
    values = [str(v) for ex in examples for v in json.loads(ex.answers[0])["arguments"].values()]
    words = {w for v in values for w in v.split()}
    assert (len(words & pooled) > 20) == (names == "pools")
    assert any(not v.isascii() for v in values) == (names == "open")  # copied as written, in any script
    shapes = Counter()
    for ex in examples:
        call = json.loads(ex.answers[0])
        tool = next(t["function"] for t in ex.tools if t["function"]["name"] == call["name"])
        declared = tool["parameters"]["properties"]
        assert set(call["arguments"]) == set(declared)
        named = call["name"] in ex.query or call["name"].replace("_", " ") in ex.query  # or its description's words
        assert named or "customer_name" in declared
        for key, value in call["arguments"].items():
            assert str(value) in ex.query  # copied from the question, nowhere else
            assert isinstance(value, int) == (declared[key]["type"] == "integer")
        shapes["none" if not declared else "customer" if "customer_name" in declared else len(declared)] += 1
        assert not [s for s in ex.segments if s.kind == "document"]  # no document holds the literal
    assert set(shapes) == {"none", "customer", 1, 2}
    # schemas as frameworks write them (bare types, bounds) and as written by hand (descriptions)
    props = [p for ex in examples for t in ex.tools for p in t["function"]["parameters"]["properties"].values()]
    assert any("description" not in p for p in props) and any("exclusiveMinimum" in p for p in props)
    assert literal_call_examples(5, seed=3, names=names) == examples[:5]
    with pytest.raises(ValueError, match="names must be 'pools' or 'open'"):
        literal_call_examples(1, seed=3, names="held_out")


def test_small_talk_under_tools_is_answered_in_words():
    from hypic_rag.training.drills import SMALL_TALK, small_talk_examples

    replies = {reply: wordings for wordings, reply in SMALL_TALK}
    examples = small_talk_examples(100, seed=2)
    for ex in examples:
        assert ex.tools and ex.query in replies[ex.answers[0]]
        assert not ex.answers[0].startswith("{")  # words, not a call
    assert len({ex.query for ex in examples}) > 15


def test_copy_drills_recall_each_made_up_value_by_its_key_and_label_the_value_alone(tok):
    for ids, labels in copy_drills(tok, 100, seed=5):
        text = tok.decode(ids)
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
        document, recalls = text.split("\n")
        pairs = {" ".join(f.split()[:2]): " ".join(f.split()[2:]) for f in document[:-1].split(". ")}
        spans = [i for i, lab in enumerate(labels) if lab != -100 and labels[i - 1] == -100]
        assert len(spans) == len(pairs) == len(recalls[:-2].split(". "))
        for start in spans:
            end = next(i for i in range(start, len(labels)) if labels[i] == -100)
            key = tok.decode(ids[:start]).split("\n")[1].split(". ")[-1].strip()
            assert pairs[key] == tok.decode(ids[start:end])  # the value the document gave that key
        words = [w for k, v in pairs.items() for w in f"{k} {v}".split()]
        assert len(set(words)) == len(words)  # no word answers two questions


def test_copy_drills_take_their_namers_and_score_one_recall(tok):
    greek = next(n for n in HELD_OUT if n.label == "greek")
    (ids, labels), *_ = copy_drills(tok, 3, seed=1, namers=(greek,), asked=1)
    text = tok.decode(ids)
    assert all("\u0370" <= c <= "\u03ff" for c in text if c.isalpha())
    assert len(text.split("\n")[1].split(". ")) == 2 and any(lab != -100 for lab in labels)


def test_paraphrases_ask_made_up_people_in_many_wordings_none_of_them_held_out():
    from hypic_rag.eval.data.pools import FIRST_NAMES
    from hypic_rag.eval.data.workloads import HELD_OUT_QUESTIONS
    from hypic_rag.training.drills import PARAPHRASES, paraphrase_examples

    templates = {q: k for k, qs in PARAPHRASES.items() for q in qs}
    assert not {q for _, q in HELD_OUT_QUESTIONS} & templates.keys()
    used, sizes = set(), set()
    for ex in paraphrase_examples(60, seed=1):
        docs = [s.text for s in ex.segments if s.kind == "document"]
        assert not set(" ".join(docs).split()) & set(FIRST_NAMES)  # made-up people only
        for question, answer in ex.meta["qa"]:
            ((template, name),) = [
                (t, m.group(1))
                for t in templates
                if (m := re.fullmatch(re.escape(t).replace(r"\{name\}", "(.+)"), question))
            ]
            used.add(template)
            assert any(name in d for d in docs if answer in d)  # the document of the one asked about
        sizes.add(len(ex.meta["qa"]) // 4)
    assert len(used) > 20 and sizes == {1, 2, 3, 4}


@pytest.mark.parametrize("names", ["pools", "open"])
def test_record_drills_copy_every_field_of_the_asked_person_in_the_schemas_keys(names):
    import json

    from hypic_rag.training.drills import RECORD_ASKS, record_examples

    asks = [re.escape(t).replace(r"\{name\}", "(.+)") for t in RECORD_ASKS]
    shapes = Counter()
    for ex in record_examples(80, seed=6, names=names):
        docs = [s.text for s in ex.segments if s.kind == "document"]
        (name,) = [m.group(1) for a in asks if (m := re.fullmatch(a, ex.query))]
        (doc,) = [d for d in docs if name in d]
        if ex.tools:  # function calling: a call of the one tool, its arguments the schema's properties
            call = json.loads(ex.answers[0])
            (tool,) = [t["function"] for t in ex.tools]
            record, schema = call["arguments"], tool["parameters"]
            assert call["name"] == tool["name"] and list(record) == sorted(schema["properties"])
        else:  # JSON content in the schema's order, as the output grammar writes it
            record = json.loads(ex.answers[0])
        assert record[next(k for k in ("name", "full_name", "person") if k in record)] == name
        assert 3 <= len(record) <= 5 and all(str(v) in doc for v in record.values())
        shapes[bool(ex.tools)] += 1
    assert shapes[True] > 20 and shapes[False] > 20
