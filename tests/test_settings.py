"""An engine's settings (hypic_rag/settings.py): checked whenever set, and the engine's attributes of their names
are its prefill program's, so a change between requests holds."""

from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.settings import PrefillSettings, check_chunk, usable_device


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


def test_the_engines_attributes_are_its_prefill_programs_settings():
    engine = Engine.from_pretrained(cold_policy="exact")
    assert engine.prefill_program.settings is engine.settings and engine.cold_policy == "exact"
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
