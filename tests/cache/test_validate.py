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
