"""An entry is checked against the layout its model's config implies (hypic_rag.cache.validate)."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.cache import CorruptEntry, EntryLayout, segment_key


@pytest.fixture(scope="module")
def made():
    engine = Engine.from_pretrained(min_cached_tokens=1)
    seg = Segment("Ana Lee lives in Oslo and works as a baker.")
    engine.generate([Segment("Bo Ek lives in Rome."), seg], "Where?", max_new_tokens=1)
    key = segment_key(engine.segment_ids(seg), engine.fingerprint, torch.float32)
    return engine, engine.segment_store.get(key, tuple(engine.segment_ids(seg)))


def test_the_engines_own_entries_fit_its_layout(made):
    engine, entry = made
    layout = EntryLayout.of(engine.model)
    layout.check(entry)
    assert set(entry.linear) == set(layout.linear_layers) and set(entry.attention) == set(layout.attention_layers)


def test_another_models_layout_refuses_them(made, checkpoint):
    _, entry = made
    other = Engine.from_pretrained(checkpoint("qwen3_next"))
    with pytest.raises(CorruptEntry):
        EntryLayout.of(other.model).check(entry)


def test_an_entry_with_layers_in_both_forms_or_tokens_past_the_dense_size_is_corrupt(made):
    from dataclasses import replace

    from hypic_rag.cache import LinearTokens
    from hypic_rag.entries import prefill_isolated

    engine, entry = made
    layout = EntryLayout.of(engine.model)
    kept = [i for i, lin in entry.linear.items() if isinstance(lin, LinearTokens)]
    assert kept, "the bundled model keeps a short segment's Gated DeltaNet layers as tokens"
    dense = prefill_isolated(engine.model, [list(entry.token_ids)], [0], compact=False)[0].entry
    mixed = replace(entry, linear={**entry.linear, kept[0]: dense.linear[kept[0]]})
    with pytest.raises(CorruptEntry, match="some linear layers kept as tokens and some dense"):
        layout.check(mixed)
    lin = entry.linear[kept[0]]
    per_token = lin.keys.shape[0] * lin.keys.shape[-1] + lin.values.shape[0] * (lin.values.shape[-1] + 2)
    dense_numbers = dense.linear[kept[0]].p.numel() + dense.linear[kept[0]].b.numel()
    n = dense_numbers // per_token + 1  # the fewest tokens whose inputs outnumber P and B
    ids = tuple(range(3, 3 + n))
    long = prefill_isolated(engine.model, [list(ids)], [0], compact=False)[0].entry
    tiled = {
        i: replace(
            t,
            keys=t.keys[:, :1].expand(-1, n, -1),
            values=t.values[:, :1].expand(-1, n, -1),
            gates=t.gates[:, :1].expand(-1, n, -1),
        )
        for i, t in entry.linear.items()
    }
    with pytest.raises(CorruptEntry, match="which its dense form holds in less"):
        layout.check(replace(long, linear=tiled))
