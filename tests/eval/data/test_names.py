"""Open-vocabulary names: fresh words, in every split's scripts, the held-out split sharing nothing with training."""

from __future__ import annotations

import random

import pytest

from hypic_rag.eval.data.names import HELD_OUT, JOB_NAMERS, ORG_KINDS, SCRAMBLED, TRAINING, OpenWorld


def test_the_held_out_namers_share_no_syllable_piece_with_the_training_ones():
    training = set().union(*(n.pieces for n in TRAINING), JOB_NAMERS["training"].pieces)
    held_out = set().union(*(n.pieces for n in HELD_OUT), JOB_NAMERS["held_out"].pieces)
    assert not training & held_out
    assert not set(ORG_KINDS["training"]) & set(ORG_KINDS["held_out"])
    assert {n.label for n in TRAINING}.isdisjoint(n.label for n in HELD_OUT)


def test_scrambled_words_use_no_held_out_character_beyond_ascii_yet_every_byte_the_held_out_split_writes():
    held_out = {c for n in (*HELD_OUT, JOB_NAMERS["held_out"]) for p in n.pieces for c in p if ord(c) > 127}
    assert held_out  # the diacritics, Greek and Han the held-out namers write
    written = {c for s in SCRAMBLED for c in s.alphabet + s.alphabet.upper()}
    assert not written & {x for c in held_out for x in (c, c.upper(), c.lower())}
    assert set("abcdefghijklmnopqrstuvwxyz") <= written
    # a byte no training example holds keeps its untrained embedding: every one the held-out names need is written
    assert {b for c in held_out for b in c.encode()} <= {b for c in written for b in c.encode()}


@pytest.mark.parametrize("namer", [*TRAINING, *HELD_OUT, *SCRAMBLED], ids=lambda n: n.label)
def test_a_namer_writes_new_words_nearly_every_time(namer):
    rng = random.Random(0)
    words = [namer.word(rng) for _ in range(500)]
    assert len(set(words)) >= 400 and all(words)
    if namer.capital and getattr(namer, "onsets", None) != ("",):
        assert all(w[0] == w[0].upper() for w in words)


@pytest.mark.parametrize("split", ["training", "held_out"])
def test_an_example_names_no_one_twice_and_no_name_inside_another(split):
    for seed in range(20):
        w = OpenWorld(random.Random(seed), split)
        names = [w.person() for _ in range(6)] + [w.city() for _ in range(6)] + [w.org() for _ in range(6)]
        words = [part for n in names for part in n.split() if part not in ORG_KINDS[split]]
        assert len(set(words)) == len(words)
        assert not any(a != b and a in b for a in words for b in words)


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split must be 'training' or 'held_out'"):
        OpenWorld(random.Random(0), "pools")
