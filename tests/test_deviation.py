"""The boundary probe (``deviation``): it reads the first attention layer only, so it places and runs no more."""

from __future__ import annotations

from dataclasses import replace

import torch

import hypic_rag.deviation as deviation
from hypic_rag import Engine, Segment
from hypic_rag.deviation import boundary_deviation, isolated_through, probe_layer, reading_shares


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in lengths]


def _warm(checkpoint, kind="kimi_linear"):
    engine = Engine.from_pretrained(checkpoint(kind), min_cached_tokens=0)
    segs, query = _segments([30, 41, 25]), Segment(token_ids=[5, 6, 7, 8])
    engine.generate(segs, query, max_new_tokens=1)  # every segment cached
    plan = engine.plan(engine.build_prompt(segs, query))
    return engine, plan, engine.prefill_program.lookup(plan)


def test_the_probe_places_only_the_layers_it_reads(checkpoint, monkeypatch):
    engine, plan, found = _warm(checkpoint)
    first = probe_layer(engine.model)
    assert first is not None and engine.model.new_state().attention_layer_ids[-1] > first  # a deeper one exists
    states, fused = [], deviation.fused_inputs

    def spy(model, state, probe, cached, through_layer=None):
        inputs = fused(model, state, probe, cached, through_layer=through_layer)
        states.append((state, inputs))
        return inputs

    monkeypatch.setattr(deviation, "fused_inputs", spy)
    dev = boundary_deviation(engine.model, plan, found, query=False)
    ((state, inputs),) = states
    placed = [i for i in state.attention_layer_ids if state.attention(i) is not None]
    assert placed == [first] and all(i < first for i in inputs.jumps.linear)
    assert dev.probe_layers == first + 1 and dev.probe_tokens == inputs.ids.shape[1]
    # the same profiles as a probe that runs the query and (deep) the last attention layer too
    deep = boundary_deviation(engine.model, plan, found, deep=True)
    assert deep.profiles.keys() == dev.profiles.keys()
    for i, profile in dev.profiles.items():
        assert torch.allclose(torch.tensor(profile), torch.tensor(deep.profiles[i]), atol=1e-5)
    assert deep.probe_tokens == dev.probe_tokens + len(plan.query)
    # a plan without a query has nothing that reads: its mass signals are 0, not the probe's own attention
    bare = boundary_deviation(engine.model, replace(plan, query=()), found, deep=True)
    assert all(s["mass"] == s["deep_mass"] == 0.0 for s in bare.per_boundary.values()) and bare.per_boundary


def test_a_cold_segment_run_alone_through_the_probed_layers_is_its_entry_there(checkpoint):
    engine, plan, found = _warm(checkpoint)
    first = probe_layer(engine.model)
    made = isolated_through(engine.model, plan.segments[1].ids, first)
    stored = found[1].entry
    assert set(made.entry.attention) == {first} and set(made.entry.linear) == {i for i in stored.linear if i < first}
    assert torch.allclose(made.entry.attention[first].values, stored.attention[first].values, atol=1e-5)
    cold = [f if i != 1 else made for i, f in enumerate(found)]
    a, b = boundary_deviation(engine.model, plan, found, query=False), boundary_deviation(engine.model, plan, cold)
    for i, profile in a.profiles.items():
        assert torch.allclose(torch.tensor(profile), torch.tensor(b.profiles[i]), atol=1e-4)


def test_reading_shares_are_the_last_tokens_attention_as_transformers_computes_it(checkpoint, reference):
    """With every segment in context the reading probe is the plain forward: each share is the attention the
    prompt's last token pays the segment at the last attention layer (mean over heads), as transformers'
    eager attention gives it."""
    path = checkpoint("qwen3_5_text")
    engine = Engine.from_pretrained(path, min_cached_tokens=0)
    segs, query = _segments([30, 41, 25]), Segment(token_ids=[5, 6, 7, 8])
    plan = engine.plan(engine.build_prompt(segs, query))
    reading = reading_shares(engine.model, plan, [None] * len(plan.segments))
    ids = torch.tensor([[t for seg in plan.segments for t in seg.ids] + list(plan.query)])
    assert reading.probe_tokens == ids.shape[1]
    model = reference(path)
    model.config._attn_implementation = "eager"
    with torch.inference_mode():
        attentions = [a for a in model(ids, use_cache=False, output_attentions=True).attentions if a is not None]
    last = attentions[-1][0, :, -1].mean(dim=0)  # [T]
    bounds = torch.tensor([len(seg.ids) for seg in plan.segments]).cumsum(0).tolist()
    expected = [float(last[a:b].sum()) for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]
    shares = torch.tensor([reading.shares[i] for i in range(len(segs))])
    assert torch.allclose(shares, torch.tensor(expected), atol=1e-5)
    assert 0 < sum(reading.shares.values()) < 1  # the rest is what the last token reads of the query itself


def test_reading_shares_of_composed_segments_follow_the_in_context_ones(checkpoint):
    """The probe composes cached segments whole (no seam): its shares are near the in-context ones and rank
    the segments alike."""
    engine, plan, found = _warm(checkpoint, "qwen3_5_text")
    composed = reading_shares(engine.model, plan, found)
    exact = reading_shares(engine.model, plan, [None] * len(found))
    assert composed.probe_tokens == len(plan.query) < exact.probe_tokens
    a = torch.tensor([composed.shares[i] for i in range(len(found))])
    b = torch.tensor([exact.shares[i] for i in range(len(found))])
    assert (a - b).abs().max() < 0.1 and a.argsort().tolist() == b.argsort().tolist()
