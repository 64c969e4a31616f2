"""The synthetic workloads: deterministic, answerable from their own segments, well-formed; their
messages make, through the bundled model's template, exactly the prompts it was trained on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from hypic_rag.chat.formats.bundled import format_call
from hypic_rag.eval.data.workloads import WORKLOADS, make, render
from hypic_rag.eval.metrics import parse_call
from hypic_rag.training.drills import recall_examples

TAGS = {"system": "sys", "document": "doc", "tool": "tool", "memory": "mem", "turn": "turn"}
ALL = (*WORKLOADS, "agent")
# The workloads built of tagged parts in one user message; framework_qa is a framework's prompt in plain text and
# conversation a conversation of many messages (their own tests below).
PARTS = tuple(w for w in ALL if w not in ("framework_qa", "conversation"))
# sha256 of each workload's segments, query, answers and meta (``_digest``): the prompts, and so the training
# data, must not change by a byte unless on purpose. First computed on the code that built the segments by
# hand, before the workloads became messages; changed once since, on purpose, when a person's description
# gained the demo's profile form (its one-fact sentences in any order), for the bundled model v2.
DIGESTS = {
    "single_doc": "d02232ed47849d4d29a2889b7d37c7148f1f6bdda4f0bf1fecf252e2613ad8b6",
    "single_doc:small": "babf585cdc8225845f79abba11f15462f66d4ec0bca646be2546fb923070eccb",
    "multi_hop": "2385c08242a6bb40c23c5897509ebe5428d0c5c4aea96c5dccace370bbae9b47",
    "multi_hop:small": "2e700ee9c666bb42b07761460573c1ea5c397300f85227cd829f7405dc26bd6b",
    "aggregate": "ec823e2088af2e1bb3ebd367df2d3a1a444961249d1f5517895d1a4cfe8cbeff",
    "aggregate:small": "198384830f59c0295d9a453f7d48cb1ecd12c4666e8604b0df77dd6ee96ef7e6",
    "tool_call": "a856331649569bbf12ba010ed05fa24be45f69cd155582b06bfd4de70a64f532",
    "tool_call:small": "95ad0005ddd3fc327d3289838254c0bf1ee4cf7ff9a44bee4ef2f738abcec63f",
    "memory": "4e8c872d8443a838de50c4916d16a0963efd7460aaa20a9dfb4f66bfee055603",
    "memory:small": "0b7874dba65e6a7f8a4538013d1dd02bf694163d30746bb7e19770247c425825",
    "framework_qa": "815143f16c0ce34bb09dd3b04be64812951618bd3f8d77887c60c995d7744eff",
    "framework_qa:small": "4af45446ac86816953c2c905f33b84caf47d01fcccad75ef48a3a394c0014084",
    "conversation": "644aa9976b71ba2f5df86613c67db2dd483906ae3777238ced27fde02824f964",
    "conversation:small": "cdca27f3576b020cf3aaad0a21e03b7b9408d42946bef4b9e06926f719ea6032",
    "open_single_doc": "74a2d04c6bc9695cd7f324989a7f273f7d4eb12ecf30477c1cbd8e2455b05da2",
    "open_single_doc:small": "b7c6b277d2751fed7c7fdb9e2bdb5028a6cbd92605599535e0fc6a9a8c2d264a",
    "open_multi_doc": "a0ce6ce8a63317ea7ff6d8261e4aa9b2ec0f705feed039397108fde00dea3a01",
    "open_multi_doc:small": "aa7c2fe5c9b9c1e1c041f0ee36b750da27d98002a4f7c794cc82f98fe71c5820",
    "agent": "26dfe9d02e909b96f331a07bf055729de36bd21f79e92a7bcc539e8b400f3278",
    "agent:small": "90317acf424a2c5e9ba902767f0a3c749c2cfbf88e1f7c6f10c66509501f3b7a",
    "recall": "dfccc2355b0ad7cb9457bf62637eb32ad125fa7647fb1323ba7b98961379f609",
}


def _digest(h, examples) -> None:
    for ex in examples:
        rendered = render(ex)
        segments = [(s.kind, s.text) for s in rendered.segments]
        meta = {k: v for k, v in ex.meta.items() if k != "reasoning"}  # added later, tested on its own
        h.update(json.dumps([segments, rendered.query.text, ex.answers, ex.metric, meta], sort_keys=True).encode())


@pytest.mark.parametrize("workload", ALL)
@pytest.mark.parametrize("small", [False, True])
def test_the_prompts_are_todays_to_the_byte(workload, small):
    h = hashlib.sha256()
    for seed in range(40):
        _digest(h, make(workload, 5, seed, small=small))
    assert h.hexdigest() == DIGESTS[workload + (":small" if small else "")]


def test_the_recall_drills_are_todays_to_the_byte():
    h = hashlib.sha256()
    for broad in (False, True):
        for seed in range(20):
            for ex in recall_examples(5, seed, broad=broad):
                rendered = render(ex)
                segments = [(s.kind, s.text) for s in rendered.segments]
                h.update(json.dumps([segments, rendered.query.text, ex.answers, ex.meta], sort_keys=True).encode())
    assert h.hexdigest() == DIGESTS["recall"]


def _hand_wrapped(ex) -> tuple[list[tuple[str, str]], str]:
    """The prompt as it was built by hand: tool schemas, the user's parts, the steps, then the question."""
    segments = [("tool", f"<tool>{json.dumps(t, separators=(',', ':'))}</tool>\n") for t in ex.tools or []]
    user, *steps = ex.messages
    for part in user["content"][:-1]:
        kind = part["hypic"]["kind"]
        segments.append((kind, f"<{TAGS[kind]}>{part['text']}</{TAGS[kind]}>\n"))
    for call, result in zip(steps[::2], steps[1::2], strict=True):
        function = call["tool_calls"][0]["function"]
        text = f"call: {format_call(function['name'], json.loads(function['arguments']))}\nresult: {result['content']}"
        segments.append(("turn", f"<turn>{text}</turn>\n"))
    return segments, f"<q>{user['content'][-1]['text']}</q>\n<a>"


@pytest.mark.parametrize("workload", PARTS)
def test_the_template_wraps_each_piece_as_the_format_did_by_hand(workload):
    for small in (False, True):
        for ex in make(workload, 30, 11, small=small):
            rendered = render(ex)
            assert ([(s.kind, s.text) for s in rendered.segments], rendered.query.text) == _hand_wrapped(ex)
            assert all(s.cache for s in rendered.segments) and ex.query == ex.messages[0]["content"][-1]["text"]
            assert "".join(s.text for s in rendered.segments) + rendered.query.text == rendered.text


def test_another_question_changes_only_the_query():
    ex = make("memory", 1, 2)[0]
    question, _ = ex.meta["qa"][-1]
    other = render(ex, question=question)
    assert other.segments == render(ex).segments and other.query.text == f"<q>{question}</q>\n<a>"
    assert ex.asking(question)[0]["content"][:-1] == ex.messages[0]["content"][:-1] and ex.query != question


def _fingerprint(examples):
    return [(ex.query, ex.answers, [(s.kind, s.text) for s in ex.segments]) for ex in examples]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_deterministic_per_seed(workload):
    assert _fingerprint(make(workload, 20, 7)) == _fingerprint(make(workload, 20, 7))
    assert _fingerprint(make(workload, 20, 7)) != _fingerprint(make(workload, 20, 8))


@pytest.mark.parametrize("workload", [w for w in WORKLOADS if w in PARTS])
def test_every_answer_comes_from_the_prompt(workload):
    for ex in make(workload, 100, 3):
        context = "".join(s.text for s in ex.segments)
        assert all(s.text.startswith(f"<{TAGS[s.kind]}>") for s in ex.segments)
        if workload == "tool_call":
            call = parse_call(ex.answers[0])
            tools = [json.loads(s.text[len("<tool>") : -len("</tool>\n")]) for s in ex.segments if s.kind == "tool"]
            assert 4 <= len(tools) <= 8
            assert all(
                t["type"] == "function" and set(t["function"]) == {"name", "description", "parameters"} for t in tools
            )
            assert call["name"] in {t["function"]["name"] for t in tools}
            for value in call["arguments"].values():
                assert str(value) in ex.query or str(value) in context
        elif workload == "aggregate":
            assert all(name in context for name in ex.answers[0].split(", "))
        else:
            assert ex.answers[0] in context
        if workload == "single_doc":
            assert 4 <= len(ex.segments) <= 12


def test_a_conversation_asks_its_turns_in_order_and_its_answer_is_in_its_history():
    for ex in make("conversation", 50, 3):
        rendered = render(ex)
        kinds = [s.kind for s in rendered.segments]
        context = "".join(s.text for s in rendered.segments)
        assert ex.answers[0] in context and rendered.query.text == f"<q>{ex.query}</q>\n<a>"
        turns = ex.meta["turns"]
        assert turns == sorted(turns) and turns[-1] < len(ex.messages)
        assert all(ex.messages[k - 1]["role"] == "user" for k in turns)  # each earlier request ends with a question
        first_turn = kinds.index("turn")
        assert "document" in kinds[first_turn:]  # a document added mid-conversation
        assert "<turn>call: " in context and "result: {" in context  # a tool call and its result
        earlier = render(replace(ex, messages=ex.messages[: turns[2]]))
        assert rendered.text.startswith(earlier.text[: -len(earlier.query.text)])  # the history only grows


def test_unknown_workload_and_bad_n():
    with pytest.raises(ValueError, match="unknown workload 'qa'"):
        make("qa", 1, 0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        make("memory", 0, 0)


def test_agent_steps_follow_from_the_earlier_turns():
    examples = make("agent", 200, 5)
    assert {ex.metric for ex in examples} == {"tool_call", "f1"}
    for ex in examples:
        turns = "".join(s.text for s in ex.segments if s.kind == "turn")
        tools = {json.loads(s.text[len("<tool>") : -len("</tool>\n")])["function"]["name"] for s in ex.segments[:2]}
        if ex.metric == "tool_call":
            call = parse_call(ex.answers[0])
            assert all(str(v) in ex.query or str(v) in turns for v in call["arguments"].values())
        else:
            assert ex.answers[0] in turns.split("result:")[-1]
        assert tools  # schemas come first


def test_people_in_one_example_share_no_first_or_last_name():
    for ex in make("single_doc", 200, 9):
        names = [q.removeprefix("How old is ").removesuffix("?") for q, _ in ex.meta["qa"] if q.startswith("How old")]
        firsts, lasts = zip(*(n.split() for n in names), strict=True)
        assert len(set(firsts)) == len(firsts) and len(set(lasts)) == len(lasts)


def test_multi_hop_reasoning_is_the_second_hop_with_its_answer():
    """The worked step training writes before a ``multi_hop`` answer: the fact about the person's company
    that the answer is read from, found in the prompt's documents and ending in the answer."""
    for ex in make("multi_hop", 30, 2) + make("multi_hop", 10, 2, small=True):
        docs = [s.text for s in ex.segments]
        assert set(ex.meta["reasoning"]) == {q for q, _ in ex.meta["qa"]}
        for question, answer in ex.meta["qa"]:
            thought = ex.meta["reasoning"][question]
            company = thought.removesuffix(f" is headquartered in {answer}.")
            assert company != thought and sum(thought in d for d in docs) == 1
            name = question.removeprefix("In which city is the company that employs ").removesuffix(" headquartered?")
            assert any(name in d and company in d for d in docs)  # the first hop: the person's document


def test_the_framework_prompts_are_the_frameworks_own_word_for_word():
    """``framework_qa`` asks in the prompts LlamaIndex sends by default; if a release rewords them, this says so."""
    from llama_index.core.prompts import chat_prompts, default_prompts

    from hypic_rag.eval.data.workloads import LLAMAINDEX_QA, LLAMAINDEX_QA_SYSTEM

    assert default_prompts.DEFAULT_TEXT_QA_PROMPT_TMPL == LLAMAINDEX_QA
    system, user = chat_prompts.CHAT_TEXT_QA_PROMPT.message_templates
    assert (system.content, user.content) == (LLAMAINDEX_QA_SYSTEM, LLAMAINDEX_QA)
    forms = {ex.meta["form"] for ex in make("framework_qa", 30, 0)}
    assert forms == {"llamaindex_chat", "llamaindex_completion", "langchain_rag", "completions_route"}


def test_a_framework_prompt_holds_its_answer_and_its_question():
    for ex in make("framework_qa", 60, 3):
        prompt = ex.messages[-1]["content"]
        assert isinstance(prompt, str) and ex.answers[0] in prompt.split("Question:")[-1].split("Query:")[0]
        assert ("Query: " in prompt) != (ex.meta["form"] == "langchain_rag")
        assert (ex.messages[0]["role"] == "system") == (ex.meta["form"] == "llamaindex_chat")


def test_a_framework_prompt_is_trained_and_scored_as_it_is_served():
    """A chat form renders as the integrations and the server hand it over (``Bundled.prepare_messages``: each of
    the context's paragraphs a document), the completions route's form as that route cuts its flat prompt."""
    from hypic_rag.chat.formats.bundled import BUNDLED
    from hypic_rag.chat.segmentation import segment_prompt
    from hypic_rag.eval.data.workloads import SEGMENTATION, bundled_template
    from hypic_rag.server.completions import prompt_segments

    examples = make("framework_qa", 40, 5)
    for ex in examples:
        served = segment_prompt(
            bundled_template(), BUNDLED.prepare_messages(ex.messages), tools=None, segmentation=SEGMENTATION
        )
        rendered = render(ex)
        assert [s.text for s in rendered.segments] == [s.text for s in served.segments]
        assert rendered.query.text == served.query.text
        if ex.meta["form"].startswith("llamaindex"):  # the question's paragraph apart, every person a document
            assert ex.answers[0] not in rendered.query.text.split("Query:")[0]
            assert sum(s.kind == "document" for s in rendered.segments) >= 3
    flat = [ex for ex in examples if "completion" in ex.meta]
    assert flat and all(ex.meta["completion"] == ex.messages[-1]["content"] for ex in flat)
    segments, query = prompt_segments(flat[0].meta["completion"])
    assert query.text.endswith("Answer: ") and "<" not in "".join(s.text for s in segments)  # no template


@pytest.mark.parametrize("workload", ["open_single_doc", "open_multi_doc"])
def test_the_held_out_split_asks_names_and_wordings_no_training_example_has(workload):
    from hypic_rag.eval.data.names import TRAINING
    from hypic_rag.eval.data.workloads import HELD_OUT_QUESTIONS, PERSON_QUESTIONS

    trained = {q for _, q in PERSON_QUESTIONS}
    held = {q for _, q in HELD_OUT_QUESTIONS}
    assert not trained & held
    training_pieces = set().union(*(n.pieces for n in TRAINING))
    for ex in make(workload, 50, 2):
        docs = [s for s in ex.segments if s.kind == "document"]
        assert len(docs) == 1 if workload == "open_single_doc" else 4 <= len(docs) <= 6
        name = ex.meta["name"]
        assert ex.query in {q.format(name=name) for q in held} and ex.metric == "exact_match"
        (about,) = [d for d in docs if name in d.text]  # one document holds the answer
        assert ex.answers[0] in about.text
        assert not any(piece in name for piece in training_pieces if len(piece) > 1 or not piece.isascii())


@pytest.mark.parametrize("workload", [w for w in ALL if not w.startswith("open_")])
def test_open_names_are_fresh_words_and_answers_still_come_from_the_prompt(workload):
    """``names="open"``: every name from ``names.TRAINING`` (no pool word anywhere), the same shapes otherwise."""
    import re

    from hypic_rag.eval.data.pools import BRANDS, FIRST_NAMES, LAST_NAMES, PET_NAMES, PLACES

    pool = re.compile(r"\b(" + "|".join(map(re.escape, (*FIRST_NAMES, *LAST_NAMES, *BRANDS, *PET_NAMES))) + r")\b")
    places = re.compile("|".join(map(re.escape, PLACES)))
    examples = make(workload, 30, 4, names="open")
    assert _fingerprint(examples) != _fingerprint(make(workload, 30, 4))
    for ex in examples:
        text = "".join(s.text for s in ex.segments) + ex.query
        assert not pool.search(text) and not places.search(text)
        if workload in PARTS and workload not in ("tool_call", "aggregate", "agent"):  # a call, a list
            assert ex.answers[0] in "".join(s.text for s in ex.segments)


def test_names_are_pools_or_open_and_the_held_out_split_keeps_its_own():
    with pytest.raises(ValueError, match="names must be one of pools, open"):
        make("single_doc", 2, 0, names="fresh")
    with pytest.raises(ValueError, match="open_single_doc draws its own held-out names"):
        make("open_single_doc", 2, 0, names="open")
