"""The fictional world's name pools and word lists, and ``World``, which draws names from them.

Names are drawn from small fixed pools rather than invented per example: each pool word recurs often
enough to become one token, so matching a name is matching one token. Examples still combine them
afresh (people are random first-last pairs with random facts), so answers come only from the prompt.

The bundled model's tokenizer and weights were trained on these exact words, and the workloads' tests
pin what they generate: change no value here.
"""

from __future__ import annotations

import random

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "m"]


def lexicon(size: int, salt: str) -> list[str]:
    """A fixed pool of ``size`` made-up two-syllable words, capitalised, the same on every machine."""
    rng = random.Random(f"lexicon:{salt}")
    words: dict[str, None] = {}
    while len(words) < size:
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(2))
        words.setdefault(w.capitalize(), None)
    return list(words)


FIRST_NAMES = lexicon(96, "first")
LAST_NAMES = lexicon(96, "last")
_SUFFIXES = ["ford", "ville", "holm", "port", "dale", "burg"] * 16
PLACES = [w + s for w, s in zip(lexicon(96, "place"), _SUFFIXES, strict=True)]
BRANDS = lexicon(96, "brand")
PET_NAMES = lexicon(48, "pet")

ROLES = ["engineer", "pilot", "chemist", "teacher", "architect", "nurse", "editor", "lawyer", "baker"]
ORG_KINDS = ["Labs", "Group", "Systems", "Works", "Partners", "Foundry", "Dynamics"]
PRODUCT_KINDS = ["lamp", "drone", "kettle", "scanner", "bicycle", "speaker", "router", "tent"]
COLORS = ["red", "blue", "green", "amber", "violet", "silver", "teal", "orange"]
PETS = ["dog", "cat", "parrot", "rabbit", "turtle"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FORECASTS = ["sunny", "light rain", "heavy rain", "snow", "fog", "clear skies", "storms", "cloudy"]


class World:
    """Fictional names from the pools, each unique within one example (no shared first or last names)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _pick(self, pool: list[str]) -> str:
        while True:
            w = self.rng.choice(pool)
            if w not in self.used:
                self.used.add(w)
                return w

    def person(self) -> str:
        return f"{self._pick(FIRST_NAMES)} {self._pick(LAST_NAMES)}"

    def city(self) -> str:
        return self._pick(PLACES)

    def org(self) -> str:
        return f"{self._pick(BRANDS)} {self.rng.choice(ORG_KINDS)}"

    def product(self) -> str:
        return f"{self._pick(BRANDS)} {self.rng.choice(PRODUCT_KINDS)}"

    def pet_name(self) -> str:
        return self._pick(PET_NAMES)

    def role(self) -> str:
        return self.rng.choice(ROLES)
