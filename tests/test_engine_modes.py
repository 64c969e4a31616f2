"""docs/design.md §6: the modes and the invariants that pin them, on tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch

import hypic_rag.engine as engine_module
import hypic_rag.prefill as prefill_module
from hypic_rag import Engine, Segment
from hypic_rag.model.context import Forward

KINDS = [
    "qwen3_next",
    "qwen3_5_text",
    "nemotron_h",
    "granitemoehybrid",
    "bamba",
    "lfm2",
    "minimax",
    "kimi_linear",
    "olmo_hybrid",
    "falcon_h1",
    "bailing_moe_linear",
    "jamba",
    "bailing_hybrid",
    "zamba2",
]
TOL = 1e-4

NO_ROPE = (torch.empty(0), torch.empty(0), torch.empty(0))  # the delta rule reads no rotary embedding


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in lengths]


def _query(seed=50):
    return Segment(
        token_ids=torch.randint(3, 320, (9,), generator=torch.Generator().manual_seed(seed)).tolist(), kind="query"
    )


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _engine(path, **options) -> Engine:
    """The segments here are short: cache every one unless a test says otherwise. The tests here are of how
    segments compose, so a repeated prompt composes again rather than restoring the state it kept last time
    (``tests/test_prefill.py`` has those)."""
    return Engine.from_pretrained(path, **{"min_cached_tokens": 0, "keep_states": False, **options})


@pytest.fixture(params=KINDS)
def engine(request, checkpoint) -> Engine:
    return _engine(checkpoint(request.param))


def test_one_segment_prompts_are_exact_in_every_mode(engine):
    segs, q = _segments([45]), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    for mode in ("pic", "hypic", "prefix"):
        assert _diff(engine.prompt_logits(segs, q, mode=mode), full) < TOL, mode
        assert _diff(engine.prompt_logits(segs, q, mode=mode), full) < TOL, mode  # warm


def test_prefix_equals_full_cold_and_warm(engine):
    segs, q = _segments([30, 41, 17, 64]), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    cold = engine.generate(segs, q, mode="prefix", max_new_tokens=1)
    warm = engine.generate(segs, q, mode="prefix", max_new_tokens=1)
    assert cold.stats["hit_segments"] == 0 and warm.stats["hit_segments"] == 4
    assert warm.stats["recomputed_tokens"] == len(q.token_ids)
    assert cold.stats["cached_tokens"] == 0 and warm.stats["cached_tokens"] == 30 + 41 + 17 + 64
    assert _diff(engine.prompt_logits(segs, q, mode="prefix"), full) < TOL
    # A shared leading segment is reused; reuse stops at the first segment that moved.
    moved = [segs[0], segs[2], segs[1], segs[3]]
    out = engine.generate(moved, q, mode="prefix", max_new_tokens=1)
    assert out.stats["hit_segments"] == 1 and out.stats["cached_tokens"] == 30
    assert _diff(engine.prompt_logits(moved, q, mode="prefix"), engine.prompt_logits(moved, q, mode="full")) < TOL


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["A", "B"])
def test_a_seam_covering_whole_segments_equals_full(checkpoint, kind, variant):
    engine = _engine(checkpoint(kind), seam_variant=variant)
    segs, q = _segments([20, 33, 12]), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    assert _diff(engine.prompt_logits(segs, q, mode="hypic", seam=1.0), full) < TOL
    assert _diff(engine.prompt_logits(segs, q, mode="hypic", seam=40), full) < TOL


def test_pic_and_hypic_approximate_full_and_the_seam_helps(engine):
    segs, q = _segments([40, 52, 36, 48], seed=3), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    pic = engine.prompt_logits(segs, q, mode="pic")
    mostly_recomputed = engine.prompt_logits(segs, q, mode="hypic", seam=0.9)
    assert _diff(pic, full) > 1e-3  # composing is an approximation past the first layer...
    assert _diff(mostly_recomputed, full) < _diff(pic, full)  # ...that recomputing shrinks
    assert _diff(engine.prompt_logits(segs, q, mode="hypic", seam=0), pic) < 1e-5


def _first_linear_state(engine: Engine, segs, q, mode: str, seam=None) -> torch.Tensor:
    _, state = engine.prefill(segs, q, mode=mode, seam=seam)
    first = state.linear_layer_ids[0]
    return state.linear(first).recurrent[0]


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "bamba"])
def test_variant_b_first_linear_layer_is_exact(checkpoint, kind):
    """Layer 0 sees token embeddings; with the seam past the conv boundary (kernel - 1 tokens; none for the
    conv-free Lightning layers) nothing it reads changed, in every family. For Ring-linear, whose Lightning
    keys are RoPE-rotated, this holds only if each cached state is rotated to where its segment now sits."""
    engine = _engine(checkpoint(kind), seam_variant="B")
    first = engine.model.linear_mixers()
    assert 0 in first, "layer 0 must be a linear layer for this invariant"
    kernel = first[0].state_shapes()["conv_tail"][1] + 1
    segs, q = _segments([40, 52, 36], seed=4), _query()
    _, full = engine.prefill(segs, q, mode="full")
    for seam in (kernel - 1, 8):
        _, got = engine.prefill(segs, q, mode="hypic", seam=seam)
        for part in ("recurrent", "conv"):
            want = getattr(full.linear(0), part)
            torch.testing.assert_close(getattr(got.linear(0), part), want, atol=1e-5, rtol=1e-5)


def test_variant_a_first_linear_layer_differs_only_through_the_conv_boundary(checkpoint):
    """Under (A) each cached segment's operator was computed from a zeroed conv history: layer 0 must
    equal a run in which exactly that happens. The last boundary sits a few tokens from the end, where
    the decay has not yet washed its effect out, so the difference from full is visible there."""
    engine = _engine(checkpoint("qwen3_next"), seam_variant="A")
    segs, q = _segments([40, 52, 6], seed=4), Segment(token_ids=[5, 6, 7], kind="query")
    layer = engine.model.model.layers[0]
    state, tail = None, None
    with torch.inference_mode():
        for i, ids in enumerate([s.token_ids for s in segs] + [q.token_ids]):
            x = layer.input_layernorm(engine.model.model.embed_tokens(torch.tensor([ids])))
            run = engine.model.new_state()
            if state is not None:
                # Cached segments restart the conv from zeros; the query reads the true tail.
                run.set_linear(0, tail if i == len(segs) else torch.zeros_like(tail), state)
            layer.linear_attn(x, Forward(torch.arange(len(ids)), NO_ROPE, run))
            state, tail = run.linear(0).recurrent, run.linear(0).conv
    hypic = _first_linear_state(engine, segs, q, "hypic", 4)
    full = _first_linear_state(engine, segs, q, "full")
    assert _diff(hypic, state[0]) < 1e-5
    assert _diff(hypic, full) > 1e-3
    assert _diff(_first_linear_state(engine, segs, q, "pic"), state[0]) < 1e-5


def test_a_reordered_warm_prompt_hits_every_segment_and_recomputes_only_seams_and_query(engine):
    segs, q = _segments([40, 52, 36, 48], seed=5), _query()
    cold = engine.generate(segs, q, mode="hypic", max_new_tokens=2, seam=8)
    assert cold.stats["hit_segments"] == 0 and cold.stats["miss_segments"] == 4
    warm = engine.generate(segs[::-1], q, mode="hypic", max_new_tokens=2, seam=8)
    assert warm.stats["hit_segments"] == 4 and warm.stats["miss_segments"] == 0
    assert warm.stats["recomputed_tokens"] == 3 * 8 + len(q.token_ids)
    # Every prompt token but the seams and the query came from the cache: OpenAI's cached_tokens.
    assert cold.stats["cached_tokens"] == 0 and warm.stats["cached_tokens"] == 40 + 52 + 36 + 48 - 3 * 8
    assert warm.stats["cache_bytes"] > 0
    pic = engine.generate(segs[1:], q, mode="pic", max_new_tokens=1)
    assert pic.stats["recomputed_tokens"] == len(q.token_ids)


def test_cold_parallel_equals_warm(engine):
    segs, q = _segments([40, 52, 36], seed=6), _query()
    cold = engine.prompt_logits(segs, q, mode="hypic")
    warm = engine.prompt_logits(segs, q, mode="hypic")
    assert torch.equal(cold, warm)


def test_exact_cold_policy_is_full_then_makes_entries(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"), cold_policy="exact")
    segs, q = _segments([40, 52, 36], seed=7), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    assert _diff(engine.prompt_logits(segs, q, mode="hypic"), full) < TOL  # every miss ran in context
    other = _segments([30, 25], seed=9)
    cold = engine.generate(other, q, mode="hypic", max_new_tokens=1)
    assert cold.stats["recomputed_tokens"] == cold.stats["prompt_tokens"] and cold.stats["hit_segments"] == 0
    warm = engine.generate(segs, q, mode="hypic", max_new_tokens=1)
    assert warm.stats["hit_segments"] == 3  # the entries made after the first request


def test_small_segments_skip_the_cache(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"), min_cached_tokens=20)
    segs, q = _segments([40, 10, 36], seed=8), _query()
    engine.generate(segs, q, mode="hypic", max_new_tokens=1)
    warm = engine.generate(segs, q, mode="hypic", max_new_tokens=1)
    assert warm.stats["hit_segments"] == 2 and warm.stats["miss_segments"] == 1
    assert warm.stats["recomputed_tokens"] == 10 + 8 + len(q.token_ids)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"seam_variant": "C"}, "unknown seam_variant 'C'"),
        ({"cold_policy": "lazy"}, "unknown cold_policy 'lazy'"),
        ({"seam": -1}, "seam must be"),
        ({"seam": 1.5}, "fractional seam"),
    ],
)
def test_bad_engine_options(checkpoint, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _engine(checkpoint("qwen3_5_text"), **kwargs)


def test_bad_seam_per_request(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"))
    with pytest.raises(ValueError, match="seam must be"):
        engine.prompt_logits(_segments([10, 10]), _query(), mode="hypic", seam="wide")


def test_uncached_segments_run_in_context_exactly(checkpoint):
    """Segments under min_cached_tokens run in context, in one stretch: hypic is then full."""
    engine = _engine(checkpoint("qwen3_next"), min_cached_tokens=1000)
    segs, q = _segments([40, 10, 36], seed=8), _query()
    out = engine.generate(segs, q, mode="hypic", max_new_tokens=1)
    assert out.stats["hit_segments"] == 0 and out.stats["recomputed_tokens"] == out.stats["prompt_tokens"]
    assert _diff(engine.prompt_logits(segs, q, mode="hypic"), engine.prompt_logits(segs, q, mode="full")) < TOL


def test_other_seam_widths_add_remainders_instead_of_evicting_each_other(checkpoint):
    """Entries are stored once; each seam width adds a small remainder entry beside them, so clients
    with different seams stop rewriting each other's entries."""
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([40, 52, 36], seed=11), _query()
    engine.generate(segs, q, mode="hypic", max_new_tokens=1, seam=4)
    writes = engine.segment_store.counters["writes"]
    other = engine.generate(segs[::-1], q, mode="hypic", max_new_tokens=1, seam=8)
    # The new first segment needs no remainder; the other two lacked theirs after 8 tokens.
    assert other.stats["hit_segments"] == 1 and other.stats["miss_segments"] == 2
    assert engine.segment_store.counters["writes"] == writes + 2  # two remainders, no entry rewritten
    writes = engine.segment_store.counters["writes"]
    for seam, order in ((4, segs), (8, segs[::-1])) * 2:
        out = engine.generate(order, q, mode="hypic", max_new_tokens=1, seam=seam)
        assert out.stats["hit_segments"] == 3 and out.stats["recomputed_tokens"] == 2 * seam + len(q.token_ids)
    assert engine.segment_store.counters["writes"] == writes
    assert engine.segment_store.stats()["memory_entries"] == 3 + 3 + 2  # entries, remainders @4, @8


@pytest.mark.parametrize("kind", ["qwen3_5_text", "nemotron_h"])
def test_segments_cached_ahead_serve_the_first_request_as_a_cold_one_would_have(checkpoint, kind):
    """``cache_segments`` stores what a cold request stores: the first request after it hits every
    segment, in any order, and its logits equal those of a warm request whose entries a cold one made."""
    segs, q = _segments([40, 52, 36, 10], seed=12), _query()
    ahead = _engine(checkpoint(kind), min_cached_tokens=20)
    assert ahead.cache_segments([*segs, segs[0]]) == 3  # a repeat is computed once, the short one not at all
    assert ahead.cache_segments(segs[::-1]) == 0
    first = ahead.generate(segs[::-1], q, mode="hypic", max_new_tokens=1)
    assert first.stats["hit_segments"] == 3 and first.stats["miss_segments"] == 1
    assert first.stats["recomputed_tokens"] == 10 + 3 * 8 + len(q.token_ids)  # the short one, seams, query
    served = _engine(checkpoint(kind), min_cached_tokens=20)
    served.generate(segs, q, mode="hypic", max_new_tokens=1)
    assert torch.equal(ahead.prompt_logits(segs[::-1], q), served.prompt_logits(segs[::-1], q))
    other = ahead.generate(segs, q, mode="hypic", max_new_tokens=1, seam=4)  # another seam: only remainders
    assert other.stats["hit_segments"] == 1
    # that request's first segment needed no seam-4 remainder; cached ahead, every segment gets one
    assert ahead.cache_segments(segs, seam=4) == 1 and ahead.cache_segments(segs[::-1], seam=4) == 0
    assert ahead.cache_segments(segs, seam=6) == 3
    assert ahead.generate(segs[::-1], q, mode="hypic", max_new_tokens=1, seam=6).stats["hit_segments"] == 3


def test_caching_ahead_refuses_what_a_request_would(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"))
    assert engine.cache_segments([]) == 0
    with pytest.raises(ValueError, match="list of Segment"):
        engine.cache_segments(_segments([10])[0])
    with pytest.raises(ValueError, match="segment 1 tokenizes to no tokens"):
        engine.cache_segments([*_segments([10]), Segment(token_ids=[])])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.cache_segments([Segment(token_ids=[10**6])])


def test_caching_ahead_stores_each_chunk_before_computing_the_next(checkpoint, monkeypatch):
    monkeypatch.setattr(engine_module, "CACHE_AHEAD_CHUNK", 2)
    engine = _engine(checkpoint("qwen3_5_text"))
    stored = []
    calls = []

    def progress(done, total):
        calls.append((done, total))
        stored.append(engine.segment_store.counters["writes"])

    # every segment dense (22 tokens or more on this checkpoint), so each stores its entry and its remainder
    assert engine.cache_segments(_segments([30, 24, 25, 40, 35], seed=13), progress=progress) == 5
    assert calls == [(2, 5), (4, 5), (5, 5)]
    per_segment = stored[0] // 2  # its entry and its remainder
    assert per_segment >= 1 and stored == [2 * per_segment, 4 * per_segment, 5 * per_segment]


@pytest.mark.parametrize("kind", ["qwen3_5_text", "nemotron_h", "kimi_linear"])
def test_auto_seams_with_an_unlimited_budget_equal_full(checkpoint, kind):
    engine = _engine(checkpoint(kind))
    segs, q = _segments([30, 41, 25, 33]), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    out = engine.generate(segs, q, mode="hypic", seam="auto", seam_budget=float("inf"), max_new_tokens=1)
    assert _diff(out.prompt_logits, full) < TOL
    assert out.stats["seam_widths"] == [0, 41, 25, 33] and out.stats["seam"] == "auto"


@pytest.mark.parametrize("kind", ["qwen3_5_text", "kimi_linear"])
def test_the_blend_baseline_with_an_unlimited_budget_equals_full_and_spends_its_budget(checkpoint, kind):
    engine = _engine(checkpoint(kind))
    segs, q = _segments([30, 41, 25, 33]), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    out = engine.generate(segs, q, seam="blend", seam_budget=float("inf"), max_new_tokens=1)
    assert _diff(out.prompt_logits, full) < TOL and out.stats["seam_widths"] == [0, 41, 25, 33]
    cold = _engine(checkpoint(kind)).generate(segs, q, seam="blend", seam_budget=5, max_new_tokens=1)
    warm = engine.generate(segs, q, seam="blend", seam_budget=5, max_new_tokens=1)
    assert sum(warm.stats["seam_widths"]) <= 5 * 3 and warm.stats["seam_widths"] == cold.stats["seam_widths"]
    assert _diff(cold.prompt_logits, warm.prompt_logits) < 1e-5
    # its probe runs every segment token through the first attention layer, as CacheBlend's first layer does
    assert warm.stats["probe_tokens"] == 30 + 41 + 25 + 33


def test_auto_seams_spend_the_budget_and_serve_cold_as_warm(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25, 33, 40]), _query()
    cold = engine.generate(segs, q, seam="auto", max_new_tokens=1)
    warm = engine.generate(segs, q, seam="auto", max_new_tokens=1)
    assert _diff(cold.prompt_logits, warm.prompt_logits) < 1e-5
    assert cold.stats["miss_segments"] == 5 and cold.stats["filled_tokens"] == sum([30, 41, 25, 33, 40])
    assert cold.stats["cached_tokens"] == 0
    assert warm.stats["hit_segments"] == 5 and warm.stats["filled_tokens"] == 0
    widths = warm.stats["seam_widths"]
    assert widths[0] == 0 and sum(widths) <= 8 * 4 and warm.stats["probe_tokens"] > 0
    seams = sum(widths)
    assert warm.stats["recomputed_tokens"] == seams + len(q.token_ids)
    # a smaller budget spends less
    lean = engine.generate(segs, q, seam="auto", seam_budget=2, max_new_tokens=1)
    assert sum(lean.stats["seam_widths"]) <= 2 * 4


def test_a_fidelity_budget_of_zero_gives_full_and_says_so(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25]), _query()
    full = engine.prompt_logits(segs, q, mode="full")
    for seam in (8, "auto"):
        out = engine.generate(segs, q, seam=seam, fidelity_budget=0.0, max_new_tokens=1)
        assert _diff(out.prompt_logits, full) < TOL
        assert out.stats["fidelity_action"] in ("exact", "widened") and out.stats["fidelity_estimate"] >= 0
    out = engine.generate(segs, q, seam=8, fidelity_budget=1e9, max_new_tokens=1)
    assert out.stats["fidelity_action"] == "none"
    assert _diff(out.prompt_logits, engine.prompt_logits(segs, q, mode="hypic", seam=8)) < 1e-6
    guarded = Engine.from_pretrained(checkpoint("qwen3_5_text"), min_cached_tokens=0, fidelity_budget=0.0)
    assert guarded.generate(segs, q, max_new_tokens=1).stats["fidelity_action"] in ("exact", "widened")
    with pytest.raises(ValueError, match="fidelity_budget"):
        engine.generate(segs, q, fidelity_budget=-1.0, max_new_tokens=1)


def test_a_request_the_guard_computes_exactly_still_caches_its_misses(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"), cold_policy="exact")
    segs, q = _segments([30, 41, 150]), _query()  # a cached segment past what widening may recompute
    engine.generate([segs[0], segs[2]], q, max_new_tokens=1)  # two of three cached
    out = engine.generate(segs, q, seam=8, fidelity_budget=0.0, max_new_tokens=1)
    assert out.stats["fidelity_action"] == "exact"
    again = engine.generate(segs, q, seam=8, max_new_tokens=1)
    assert again.stats["hit_segments"] == 3  # the middle one was filled after the exact request's first token


def _spy_fills(monkeypatch) -> list[tuple[int, int]]:
    """(length, remainder width) of every segment the engine prefills in isolation."""
    filled, prefill = [], prefill_module.prefill_isolated

    def spy(model, ids, widths, **kwargs):
        filled.extend(zip(map(len, ids), widths, strict=True))
        return prefill(model, ids, widths, **kwargs)

    monkeypatch.setattr(prefill_module, "prefill_isolated", spy)
    return filled


def test_the_guard_fills_each_cold_segment_once(checkpoint, monkeypatch):
    """A cold boundary is probed from its segment run alone through the probed layers, then filled once, with
    the remainder of the width the guard chose (not filled for the default seam first and again for that)."""
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25]), _query()
    filled = _spy_fills(monkeypatch)
    cold = engine.generate(segs, q, max_new_tokens=1, seam=8, fidelity_budget=0.0)
    assert sorted(n for n, _ in filled) == [25, 30, 41]  # each once (after the first token, if run exactly)
    if cold.stats["fidelity_action"] == "exact":
        return
    assert cold.stats["filled_tokens"] == 96 and cold.stats["probe_cold_tokens"] == 96
    widths = dict(zip([30, 41, 25], cold.stats["seam_widths"], strict=True))
    assert all(w == widths[n] for n, w in filled if 0 < widths[n] < n)  # the remainder it composes


def test_auto_fills_cold_segments_first_so_cold_equals_warm(checkpoint, monkeypatch):
    """auto's reading probe runs every layer: its cold segments are filled before the probes, which then read
    their entries as a warm request's do, so a cold request chooses the widths a warm one does and gives its
    logits. A width whose remainder the entry cannot give is filled a second time, with that remainder."""
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25]), _query()
    filled = _spy_fills(monkeypatch)
    cold = engine.generate(segs, q, max_new_tokens=1, seam="auto", seam_budget=3)
    assert sorted(n for n, _ in filled[:3]) == [25, 30, 41]  # every miss, before the probes
    widths = dict(zip([30, 41, 25], cold.stats["seam_widths"], strict=True))
    assert all(w == widths[n] and 0 < w < n for n, w in filled[3:])  # again only for the remainder it composes
    assert cold.stats["filled_tokens"] == sum(n for n, _ in filled) and cold.stats["probe_cold_tokens"] == 0
    assert cold.stats["hit_segments"] == 0 and cold.stats["cached_tokens"] == 0
    warm = engine.generate(segs, q, max_new_tokens=1, seam="auto", seam_budget=3)
    assert warm.stats["filled_tokens"] == 0 and warm.stats["seam_widths"] == cold.stats["seam_widths"]
    assert warm.stats["probe_tokens"] == cold.stats["probe_tokens"] and warm.stats["hit_segments"] == 3
    assert _diff(cold.prompt_logits, warm.prompt_logits) < 1e-5


def test_a_cold_request_auto_computes_exactly_counts_what_it_filled_first(checkpoint, monkeypatch):
    """Over its fidelity budget ``auto`` computes the prompt as ``full`` does, after it filled the cold
    segments for its probes: those fills were run too, and the stats say so."""
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25]), _query()
    filled = _spy_fills(monkeypatch)
    out = engine.generate(segs, q, max_new_tokens=1, seam="auto", fidelity_budget=0.0)
    assert out.stats["fidelity_action"] == "exact" and sorted(n for n, _ in filled) == [25, 30, 41]
    assert out.stats["filled_tokens"] == 96 and out.stats["cached_tokens"] == 0
    assert out.stats["recomputed_tokens"] == out.stats["prompt_tokens"] + 96
    assert _diff(out.prompt_logits, engine.prompt_logits(segs, q, mode="full")) < TOL


def _steps(prefilling) -> list[int]:
    ran = []
    while prefilling.generation is None:
        ran.append(prefilling.advance())
    return ran


def test_a_cold_exact_auto_request_steps_through_what_its_stats_count(checkpoint):
    """Chunked, a cold ``auto`` request over its budget fills its segments, probes, then runs the prompt as
    ``full`` does: the steps it reports add up to the tokens its stats say it computed."""
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25]), _query()
    cold = engine.start(segs, q, seam="auto", fidelity_budget=0.0, max_new_tokens=1, prefill_chunk=16)
    ran = _steps(cold)
    stats = engine.run_together([cold.generation])[0].stats
    assert stats["fidelity_action"] == "exact" and stats["filled_tokens"] == 96
    assert sum(ran) == stats["recomputed_tokens"] + stats["probe_tokens"] and max(ran) <= 41


def test_the_guard_respects_the_prefill_chunk(checkpoint):
    """The probe is a step of its own, and a request the guard computes exactly runs in chunks, so a long
    guarded prompt holds a batch's other requests back by a chunk, not by its whole prefill."""
    engine = _engine(checkpoint("qwen3_5_text"))
    segs, q = _segments([30, 41, 25]), _query()
    engine.generate(segs, q, max_new_tokens=1)  # warm: no cold segment steps
    full = engine.prompt_logits(segs, q, mode="full")
    exact = engine.start(segs, q, seam=8, fidelity_budget=0.0, max_new_tokens=1, prefill_chunk=16)
    ran = _steps(exact)
    out = engine.run_together([exact.generation])[0]
    assert out.stats["fidelity_action"] == "exact" and _diff(out.prompt_logits, full) < TOL
    assert ran[0] == out.stats["probe_tokens"]  # the probe, then the prompt in chunks
    assert max(ran[1:]) <= 16 and len(ran[1:]) >= (96 + 9) // 16
    auto = engine.start(segs, q, seam="auto", max_new_tokens=1, prefill_chunk=16)
    ran = _steps(auto)
    stats = auto.generation.stats
    # the boundaries' probe, the reading probe (the query over the composed segments), then the fused forward
    assert len(ran) == 3 and ran[0] + ran[1] == stats.probe_tokens and ran[2] == stats.recomputed_tokens
    assert ran[1] == len(engine.build_prompt(segs, q).query)


def test_the_guard_never_widens_pic(checkpoint):
    """pic has no seams by definition: over the budget the guard computes it exactly, never with seams."""
    segs, q = _segments([30, 41, 25]), _query()
    full = _engine(checkpoint("qwen3_5_text")).prompt_logits(segs, q, mode="full")
    strict = _engine(checkpoint("qwen3_5_text"), fidelity_budget=0.0)
    out = strict.generate(segs, q, mode="pic", max_new_tokens=1)
    assert out.stats["fidelity_action"] == "exact" and _diff(out.prompt_logits, full) < TOL
    loose = _engine(checkpoint("qwen3_5_text"), fidelity_budget=1e9)
    out = loose.generate(segs, q, mode="pic", max_new_tokens=1)
    assert out.stats["fidelity_action"] == "none" and out.stats["seam_widths"] == [0, 0, 0]
    plain = _engine(checkpoint("qwen3_5_text")).generate(segs, q, mode="pic", max_new_tokens=1)
    assert _diff(out.prompt_logits, plain.prompt_logits) < 1e-6
    # a budget pic misses but hypic's widening meets: hypic widens, pic runs exactly
    middle = out.stats["fidelity_estimate"] / 2
    assert (
        strict.generate(segs, q, mode="pic", fidelity_budget=middle, max_new_tokens=1).stats["fidelity_action"]
        == "exact"
    )


def test_auto_is_also_an_engine_default(checkpoint):
    engine = _engine(checkpoint("qwen3_5_text"), seam="auto")
    segs, q = _segments([30, 41]), _query()
    out = engine.generate(segs, q, max_new_tokens=1)
    assert out.stats["seam"] == "auto" and out.stats["seam_widths"][0] == 0
    assert engine.generate(segs, q, seam=8, max_new_tokens=1).stats["seam"] == 8  # a request's own wins
    with pytest.raises(ValueError, match="seam"):
        _engine(checkpoint("qwen3_5_text"), seam="widest")
