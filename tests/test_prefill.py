"""The composed modes read the exact prefix store first: the leading segments it holds are restored as ``prefix``
mode would restore them, and only the segments after them are composed, the first of those with its seam run in
the context of that exact state."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.assembly import install_segment, run_in_context
from hypic_rag.cache.prefix import composed_namespace
from hypic_rag.testing.parity import rounding_bound
from hypic_rag.testing.synthetic import TEMPLATES

KINDS = ["qwen3_5_text", "nemotron_h"]  # a dense operator (Gated DeltaNet) and a scalar one (Mamba2)
SEAM = 8


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in lengths]


QUERY = Segment(token_ids=[5, 6, 7, 8, 9, 10, 11], kind="query")


def _engine(checkpoint, kind: str, **options) -> Engine:
    return Engine.from_pretrained(checkpoint(kind), **{"min_cached_tokens": 0, "seam": SEAM, **options})


def _bound(engine: Engine, segs) -> float:
    ids = torch.tensor([[i for s in [*segs, QUERY] for i in s.token_ids]])
    return rounding_bound(engine.model, ids)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fused", [True, False])
def test_a_composed_request_restores_the_cached_prefix_and_composes_the_rest_onto_it(checkpoint, kind, fused):
    engine = _engine(checkpoint, kind, fuse_forwards=fused)
    segs = _segments([30, 41, 36, 35])  # each long enough to compose after a restored state
    engine.generate(segs[:2], QUERY, mode="prefix", max_new_tokens=1)  # the exact prefix: segs 0 and 1
    engine.generate(segs[:1:-1], QUERY, mode="hypic", max_new_tokens=1)  # entries for segs 2 and 3
    out = engine.generate(segs, QUERY, mode="hypic", max_new_tokens=1)
    stats = out.stats
    assert stats["prefix_segments"] == 2 and stats["hit_segments"] == 4 and stats["miss_segments"] == 0
    assert stats["recomputed_tokens"] == 2 * SEAM + len(QUERY.token_ids)  # the two seams after it and the query
    assert stats["cached_tokens"] == 30 + 41 + 36 + 35 - 2 * SEAM == stats["prompt_tokens"] - stats["recomputed_tokens"]
    # The same by hand: the two leading segments run exactly, each later one's seam in their context, its
    # cached rest composed onto the state after it.
    model, program = engine.model, engine.prefill_program
    state = model.new_state()
    with torch.inference_mode():
        run_in_context(model, state, [*segs[0].token_ids, *segs[1].token_ids])
        plan = program.plan(engine.build_prompt(segs, QUERY), "hypic")
        for seg, found in zip(plan.segments[2:], program.lookup(plan)[2:], strict=True):
            assert seg.seam == SEAM and found is not None
            install_segment(model, state, found, seg.seam, plan.variant)
        want = program.last_logits(QUERY.token_ids, state)
    assert float((out.prompt_logits - want).abs().max()) <= _bound(engine, segs)


@pytest.mark.parametrize("kind", KINDS)
def test_after_a_restored_prefix_a_short_cached_segment_runs_whole_in_context(checkpoint, kind):
    """A cached segment shorter than ``SHORT_SEAMS`` of its seams (a message that recurs) runs exactly after a
    restored state: a hit, none of it composed; a long one after it still composes."""
    engine = _engine(checkpoint, kind)
    segs = _segments([30, 41, 20, 40], seed=12)
    engine.generate(segs[:2], QUERY, mode="prefix", max_new_tokens=1)
    engine.generate(segs[:1:-1], QUERY, mode="hypic", max_new_tokens=1)  # entries for the short and the long one
    out = engine.generate(segs, QUERY, mode="hypic", max_new_tokens=1)
    stats = out.stats
    assert stats["prefix_segments"] == 2 and stats["hit_segments"] == 4 and stats["miss_segments"] == 0
    assert stats["recomputed_tokens"] == 20 + SEAM + len(QUERY.token_ids)
    assert stats["cached_tokens"] == 30 + 41 + 40 - SEAM
    model, program = engine.model, engine.prefill_program
    state = model.new_state()
    with torch.inference_mode():
        run_in_context(model, state, [i for seg in segs[:3] for i in seg.token_ids])
        plan = program.plan(engine.build_prompt(segs, QUERY), "hypic")
        install_segment(model, state, program.lookup(plan)[3], SEAM, plan.variant)
        want = program.last_logits(QUERY.token_ids, state)
    assert float((out.prompt_logits - want).abs().max()) <= _bound(engine, segs)


@pytest.mark.parametrize("kind", KINDS)
def test_after_a_restored_prefix_a_seam_over_whole_segments_still_equals_full(checkpoint, kind):
    engine = _engine(checkpoint, kind)
    segs = _segments([30, 41, 26, 35], seed=1)
    engine.generate(segs[:2], QUERY, mode="prefix", max_new_tokens=1)
    full = engine.prompt_logits(segs, QUERY, mode="full")
    out = engine.generate(segs, QUERY, mode="hypic", seam=1.0, max_new_tokens=1)
    assert out.stats["prefix_segments"] == 2
    assert float((out.prompt_logits - full).abs().max()) <= _bound(engine, segs)


@pytest.mark.parametrize("mode", ["hypic", "pic"])
def test_a_prompt_the_prefix_store_holds_whole_runs_only_its_query_as_prefix_does(checkpoint, mode):
    engine = _engine(checkpoint, "nemotron_h")
    segs = _segments([30, 41, 26], seed=2)
    engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    want = engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    out = engine.generate(segs, QUERY, mode=mode, max_new_tokens=1)
    assert out.stats["prefix_segments"] == 3 and out.stats["recomputed_tokens"] == len(QUERY.token_ids)
    assert out.stats["cached_tokens"] == want.stats["cached_tokens"] == 30 + 41 + 26
    assert float((out.prompt_logits - want.prompt_logits).abs().max()) <= _bound(engine, segs)


def test_reordered_documents_still_hit_their_entries(checkpoint):
    """The prefix stops at the first segment that moved; every segment after it is composed as before."""
    engine = _engine(checkpoint, "qwen3_5_text")
    segs = _segments([30, 41, 36], seed=3)
    engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    cold = engine.generate(segs[::-1], QUERY, mode="hypic", max_new_tokens=1)  # no prefix: entries for all three
    assert cold.stats["prefix_segments"] == 0 and cold.stats["miss_segments"] == 3
    reordered = engine.generate([segs[1], segs[2], segs[0]], QUERY, mode="hypic", max_new_tokens=1)
    assert reordered.stats["prefix_segments"] == 0 and reordered.stats["hit_segments"] == 3
    moved = engine.generate([segs[0], segs[2], segs[1]], QUERY, mode="hypic", max_new_tokens=1)
    assert moved.stats["prefix_segments"] == 1 and moved.stats["hit_segments"] == 3
    assert moved.stats["recomputed_tokens"] == 2 * SEAM + len(QUERY.token_ids)


def test_a_guarded_request_composes_from_the_start(checkpoint):
    """``auto`` seams and a fidelity budget probe the plan from the prompt's start: no prefix is restored."""
    engine = _engine(checkpoint, "nemotron_h")
    segs = _segments([30, 41, 26], seed=4)
    engine.generate(segs, QUERY, mode="prefix", max_new_tokens=1)
    out = engine.generate(segs, QUERY, mode="hypic", seam="auto", max_new_tokens=1)
    assert out.stats["prefix_segments"] == 0


# -- continuation: a conversation's next turn restores the state its last turn ended with ------------------------


def _turns(engine: Engine, mode: str, seed: int, **options):
    """Turn 1 (two documents and a question), its answer, and turn 2, whose query begins with turn 1's question and
    answer: its outputs, the tokens turn 1's state covered after its answer, and turn 2's prompt."""
    segs = _segments([30, 41], seed=seed)
    first = engine.generate(segs, QUERY, mode=mode, max_new_tokens=4, **options)
    answer = first.token_ids
    # the last token chosen went through the model only if a stop id ended the answer after it
    ran = len(answer) - (first.finish_reason == "length")
    follow = Segment(token_ids=[*QUERY.token_ids, *answer, 12, 13, 14, 15, 16], kind="query")
    second = engine.generate(segs, follow, mode=mode, max_new_tokens=1, **options)
    return first, second, 30 + 41 + len(QUERY.token_ids) + ran, engine.build_prompt(segs, follow)


@pytest.mark.parametrize("kind", KINDS)
def test_prefix_mode_continues_a_conversation_from_its_answer_and_still_equals_full(checkpoint, kind):
    engine = _engine(checkpoint, kind)
    _, second, covered, prompt = _turns(engine, "prefix", seed=5)
    assert second.stats["prefix_tokens"] == second.stats["cached_tokens"] == covered
    assert second.stats["recomputed_tokens"] == len(prompt.ids) - covered  # only what is new since the answer
    full = engine.generate(_segments([30, 41], seed=5), Segment(token_ids=prompt.query), mode="full", max_new_tokens=1)
    assert float((second.prompt_logits - full.prompt_logits).abs().max()) <= rounding_bound(
        engine.model, torch.tensor([prompt.ids])
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_composed_turn_continues_from_the_state_its_last_turn_used(checkpoint, kind):
    engine = _engine(checkpoint, kind)
    _, second, covered, prompt = _turns(engine, "hypic", seed=6)
    assert second.stats["prefix_tokens"] == covered and second.stats["prefix_segments"] == 2
    assert second.stats["recomputed_tokens"] == len(prompt.ids) - covered
    # By hand: turn 1's prompt composed (on an engine that keeps nothing), its answer and turn 2's new tokens run
    # after it in context.
    alone = _engine(checkpoint, kind, keep_states=False)
    alone.generate(_segments([30, 41], seed=6), QUERY, mode="hypic", max_new_tokens=1)  # the entries, warm
    first = alone.prefill_program.run(alone.build_prompt(_segments([30, 41], seed=6), QUERY), "hypic", None)
    with torch.inference_mode():
        run_in_context(alone.model, first.state, prompt.ids[first.state.seq_len : -1])
        want = alone.prefill_program.last_logits(prompt.ids[-1:], first.state)
    assert float((second.prompt_logits - want).abs().max()) <= rounding_bound(engine.model, torch.tensor([prompt.ids]))
    # The composed state is the composed requests' own: prefix mode restores only what it kept itself.
    follow = Segment(token_ids=prompt.query)
    again = engine.generate(_segments([30, 41], seed=6), follow, mode="prefix", max_new_tokens=1)
    assert again.stats["prefix_tokens"] == 0


def test_an_engine_that_keeps_no_states_composes_every_turn(checkpoint):
    engine = _engine(checkpoint, "qwen3_5_text", keep_states=False)
    _, second, _, _ = _turns(engine, "hypic", seed=7)
    assert second.stats["prefix_tokens"] == 0 and second.stats["hit_segments"] == 2
    assert engine.prefix_store.stats()["prefix_nodes"] == 0


@pytest.fixture(scope="module")
def qwen35_chat(checkpoint, tmp_path_factory) -> Engine:
    """The tiny Gated DeltaNet checkpoint with the Qwen3.5-style template, which drops an earlier answer's
    reasoning block when it renders it again."""
    import shutil

    from hypic_rag.testing.synthetic import add_chat_files

    path = tmp_path_factory.mktemp("qwen35") / "chat"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    template = (TEMPLATES / "qwen3_5.jinja").read_text()
    return Engine.from_pretrained(add_chat_files(path, template), min_cached_tokens=0, seam=SEAM)


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("mode", ["prefix", "hypic"])
def test_a_chat_turn_restores_the_last_state_its_prompt_still_begins_with(qwen35_chat, mode):
    """The template renders turn 1's answer without the generation prompt's reasoning block: turn 2 falls back
    to the state kept where that generation prompt began, never to one its tokens do not match."""
    engine = qwen35_chat
    engine.clear_cache()
    messages = [
        {"role": "system", "content": "Answer from the notes. The museum opens at nine and closes at five."},
        {"role": "user", "content": "When does the museum open?"},
    ]
    kwargs = {"mode": mode, "max_new_tokens": 6, "chat_template_kwargs": {"enable_thinking": False}}
    first = engine.chat(messages, **kwargs)
    asked = engine.render(messages, chat_template_kwargs={"enable_thinking": False}).token_ids
    messages += [{"role": "assistant", "content": first.text or "nine"}, {"role": "user", "content": "And close?"}]
    second = engine.chat(messages, **kwargs)
    ids = engine.render(messages, chat_template_kwargs={"enable_thinking": False}).token_ids
    generation_prompt = engine.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert asked[-len(generation_prompt) :] == generation_prompt
    shared = _common(ids, [*asked, *first.token_ids])  # what turn 2 has in common with turn 1 and its answer
    assert shared < len(asked)  # the reasoning block the template dropped
    restored = second.stats["prefix_tokens"]
    assert restored == len(asked) - len(generation_prompt)  # the state kept before it, not a later one
    assert second.stats["recomputed_tokens"] <= len(ids) - shared + 3 * SEAM
    if mode == "prefix":
        full = engine.chat(messages, **{**kwargs, "mode": "full"})
        assert float((second.prompt_logits - full.prompt_logits).abs().max()) <= rounding_bound(
            engine.model, torch.tensor([ids])
        )


# -- runs: the turns after a document inserted into the history compose as one cached segment -------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["A", "B"])
def test_the_turns_after_an_inserted_document_compose_as_the_run_the_conversation_kept(checkpoint, kind, variant):
    """Turn 1 over documents a and b; then document x inserted before b: a, x and b compose, and turn 1 (its question
    and answer) is found as a run of kept nodes and composes as one segment with one seam. Its linear states after
    it are the ones the conversation had there, and its KV the conversation's moved by x's length."""
    from hypic_rag.kernels.algebra import rerotate

    engine = _engine(checkpoint, kind, seam_variant=variant)
    a, b, x = _segments([30, 41, 12], seed=8)
    question = Segment(token_ids=list(range(20, 32)), kind="query")
    first = engine.generate([a, b], question, mode="hypic", max_new_tokens=4)
    ran = len(first.token_ids) - (first.finish_reason == "length")
    turn = Segment(token_ids=[*question.token_ids, *first.token_ids[:ran]])
    follow = Segment(token_ids=[40, 41, 42, 43, 44], kind="query")
    namespaces = (composed_namespace(SEAM, variant),)
    ids = engine.build_prompt([a, x, b, turn], follow).ids
    at = 30 + 12 + 41
    old = engine.prefix_store.find_run(ids, at, namespaces, len(ids) - len(follow.token_ids))
    assert old is not None and old.length == len(turn.token_ids) and old.first == 71
    old_kv = old.kv()

    second = engine.generate([a, x, b, turn], follow, mode="hypic", max_new_tokens=1)
    assert second.stats["run_tokens"] == len(turn.token_ids) - SEAM
    # x was cold (filled alone), then its seam, b's, the run's and the question
    assert second.stats["recomputed_tokens"] == 12 + 3 * SEAM + len(follow.token_ids)
    start = len(ids) - len(follow.token_ids)
    kept = engine.prefix_store.find(ids[: start + 1], namespaces)
    assert kept is not None and kept.length == start  # the state where turn 2's question began
    state = engine.model.new_state()
    engine.prefix_store.restore(kept, state)
    for i, layer in old.point.linear.items():  # the operator of a run is zero: its kept states, as they were
        assert torch.equal(state.linear(i).recurrent, layer.recurrent)
        assert torch.equal(state.linear(i).conv, layer.conv)
    inv_freq = engine.model.inv_freq
    for i, layer in old_kv.items():
        now = state.attention(i)
        order = now.positions.argsort()  # a request's KV is held in the order it was placed, each at its position
        cached = order[at + SEAM : at + old.length]  # the run's tokens after its seam
        assert torch.equal(now.positions[cached], layer.positions[SEAM:] + 12)
        assert torch.equal(now.values[0][:, cached], layer.values[0][:, SEAM:])
        if inv_freq.numel():  # keys rotated at their positions: the conversation's, moved by x's 12 tokens
            was = rerotate(layer.keys[0].float(), layer.shift + 12, inv_freq)[:, SEAM:]
            keys = rerotate(now.keys[0].float(), now.shift, inv_freq)[:, cached]
            assert float((keys - was).abs().max()) < 1e-4


def test_a_turns_new_segments_after_the_state_it_continues_run_in_context_and_are_cached_after(checkpoint):
    """Composing them would prefill the same tokens alone and add a seam: they run in context, exactly, and get
    their entries once the first token is out (as under the exact cold policy)."""
    engine = _engine(checkpoint, "qwen3_5_text")
    a, b, c = _segments([30, 41, 20], seed=9)
    first = engine.generate([a, b], QUERY, mode="hypic", max_new_tokens=1)
    turn = Segment(token_ids=[*QUERY.token_ids])
    follow = Segment(token_ids=[40, 41, 42, 43, 44], kind="query")
    second = engine.generate([a, b, turn, c], follow, mode="hypic", max_new_tokens=1)
    assert second.stats["prefix_tokens"] == 30 + 41 + len(QUERY.token_ids) and first.stats["filled_tokens"] == 71
    assert second.stats["recomputed_tokens"] == 20 + len(follow.token_ids) and second.stats["filled_tokens"] == 0
    key = engine.prefill_program.plan(engine.build_prompt([c], follow)).segments[0].key
    assert key in engine.segment_store  # filled after the first token
    # by hand: the state turn 1 kept where its query ended, then c and the question in context
    kept = engine.prefix_store.find(engine.build_prompt([a, b], QUERY).ids + [0], (composed_namespace(SEAM, "B"),))
    state = engine.model.new_state()
    engine.prefix_store.restore(kept, state)
    with torch.inference_mode():
        run_in_context(engine.model, state, c.token_ids)
        want = engine.prefill_program.last_logits(follow.token_ids, state)
    ids = engine.build_prompt([a, b, turn, c], follow).ids
    assert float((second.prompt_logits - want).abs().max()) <= rounding_bound(engine.model, torch.tensor([ids]))
