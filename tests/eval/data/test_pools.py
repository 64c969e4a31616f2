"""The pools are what the bundled model was trained on: their words must never change."""

from __future__ import annotations

import hashlib
import json
import random

from hypic_rag.eval.data import pools

NAMES = [
    "FIRST_NAMES", "LAST_NAMES", "PLACES", "BRANDS", "PET_NAMES", "ROLES",
    "ORG_KINDS", "PRODUCT_KINDS", "COLORS", "PETS", "DAYS", "FORECASTS",
]  # fmt: skip


def test_the_pools_are_the_ones_the_bundled_model_learned():
    values = {name: getattr(pools, name) for name in NAMES}
    digest = hashlib.sha256(json.dumps(values).encode()).hexdigest()
    assert digest == "6a4a5197b8012c621012b8bbd1ddc602658dff2073ecef642dbf7fbd21f100b7"
    assert [len(values[n]) for n in ("FIRST_NAMES", "LAST_NAMES", "PLACES", "BRANDS", "PET_NAMES")] == [96] * 4 + [48]


def test_a_world_never_hands_out_a_name_twice():
    world = pools.World(random.Random(0))
    people = [world.person() for _ in range(40)]
    firsts, lasts = zip(*(p.split() for p in people), strict=True)
    assert len(set(firsts)) == len(set(lasts)) == 40
    assert all(f in pools.FIRST_NAMES and la in pools.LAST_NAMES for f, la in zip(firsts, lasts, strict=True))
