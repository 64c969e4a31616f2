"""An engine's settings (hypic_rag/settings.py): checked whenever set, and the engine's attributes of their names
are its prefill program's, so a change between requests holds."""

from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.settings import CacheSettings, EngineSettings, PrefillSettings, check_chunk, usable_device


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("cold_policy", "lazy", "unknown cold_policy"),
        ("seam_variant", "C", "unknown seam_variant"),
        ("min_cached_tokens", -1, "min_cached_tokens must be an integer >= 0"),
        ("fuse_forwards", 1, "fuse_forwards must be True or False"),
        ("seam", -2, "seam"),
        ("fidelity_budget", -0.5, "fidelity_budget"),
    ],
)
def test_a_bad_setting_is_refused_when_made_and_when_changed(name, value, words):
    with pytest.raises(ValueError, match=words):
        PrefillSettings(**{name: value})
    settings = PrefillSettings()
    with pytest.raises(ValueError, match=words):
        setattr(settings, name, value)
    assert getattr(settings, name) == getattr(PrefillSettings(), name)  # nothing half set


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("cache_dir", "redis://127.0.0.1:6379/0", "cache_dir is a folder"),
        ("cache_url", "http://127.0.0.1:6379", "cache_url must be redis://"),
        ("memory_bytes", -1, r"memory_bytes \(the memory budget\) must be an integer >= 0"),
        ("disk_bytes", 0, "disk_bytes must be an integer >= 1"),
        ("entry_dtype", "int8", "entry_dtype must be one of"),
        ("cache_policy", "lfu", "unknown cache_policy"),
        ("cache_secret", "short", "cache_secret must be at least 16 bytes"),
    ],
)
def test_a_bad_cache_setting_is_refused_when_made_and_by_the_engine(name, value, words):
    with pytest.raises(ValueError, match=words):
        CacheSettings(**{name: value})
    engine = Engine.from_pretrained()
    with pytest.raises(ValueError, match=words):
        Engine(engine.model, engine.tokenizer, **{name: value})


def test_cache_settings_are_normalised_when_made(tmp_path):
    import torch

    made = CacheSettings(cache_dir=str(tmp_path), entry_dtype="bfloat16", cache_secret="s" * 16)
    assert made.cache_dir == tmp_path and made.entry_dtype is torch.bfloat16 and made.cache_secret == b"s" * 16
    assert "s" * 16 not in repr(made)  # a secret is never printed
    with pytest.raises(ValueError, match="flush_denormals must be True or False"):
        EngineSettings(flush_denormals=1)


def test_the_engines_attributes_are_its_prefill_programs_settings():
    engine = Engine.from_pretrained(cold_policy="exact")
    assert engine.prefill_program.settings is engine.settings.prefill and engine.cold_policy == "exact"
    engine.cold_policy = "parallel"
    assert engine.prefill_program.settings.cold_policy == "parallel"
    with pytest.raises(ValueError, match="unknown cold_policy"):
        engine.cold_policy = "later"


def test_devices_and_chunks_are_checked_before_any_work():
    with pytest.raises(ValueError, match="not a torch device"):
        usable_device("gpu:zero")
    assert usable_device("cpu").type == "cpu"
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="prefill_chunk"):
            check_chunk(bad)
    assert check_chunk(None) is None and check_chunk(8) == 8
