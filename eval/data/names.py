"""Open-vocabulary names: made-up words drawn fresh from syllable inventories, in several scripts.

Why: a model trained on the fixed pools (``pools``) learns the pools, and on names outside them it answers
almost nothing; a model that answers from its context has to copy what it reads. A ``Namer`` writes words from
its own onsets, nuclei and codas, so nearly every name is new and no answer can be remembered. The training
draws from ``TRAINING``; the held-out split from ``HELD_OUT``, whose inventories and scripts the training never
sees (a test holds the two apart): Latin syllables of another shape, other diacritics, Greek and Han where the
training has Cyrillic and katakana. Jobs are made-up words too, and companies a made-up word with a kind.

``SCRAMBLED`` writes words of characters in no order, from a dozen scripts: a namer's syllables are a pattern a
model can learn to write without reading, and a run of random characters leaves it only copying. Its letters
include every ASCII one (any name is written in them) but no other character the held-out namers write, in
either case. It does write other Greek letters (accented, Coptic, the three the held-out namer lacks) and other
Han characters: a byte no training example holds keeps its untrained embedding, and a model that copied random
ASCII exactly wrote garbage for every Greek and Han name, whose UTF-8 lead bytes only those scripts use. So the
held-out split holds out characters and syllable shapes, and every byte it writes was seen in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .pools import PRODUCT_KINDS


@dataclass(frozen=True)
class Namer:
    """Words of ``syllables`` (inclusive range) onset-nucleus-coda syllables; ``capital``: capitalised."""

    label: str
    onsets: tuple[str, ...]
    nuclei: tuple[str, ...]
    codas: tuple[str, ...]
    syllables: tuple[int, int] = (2, 3)
    capital: bool = True

    def word(self, rng: random.Random) -> str:
        n = rng.randint(*self.syllables)
        w = "".join(rng.choice(self.onsets) + rng.choice(self.nuclei) + rng.choice(self.codas) for _ in range(n))
        return w[:1].upper() + w[1:] if self.capital else w

    @property
    def pieces(self) -> set[str]:
        """Every non-empty onset, nucleus and coda: what a held-out namer must not share with the training's."""
        return {p for p in (*self.onsets, *self.nuclei, *self.codas) if p}


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split())


TRAINING = (
    Namer("latin", _split("b d f g k l m n p r s t v z br dr kr st tr gl pl sk"), _split("a e i o u ai ou ea"),
          ("", *_split("n r l s m th nd"))),
    Namer("accented", _split("b d g l m n r s t ç ñ ł š ž"), _split("á é í ó ú ä ö ü å ø"), ("", *_split("n r l s"))),
    Namer("cyrillic", _split("б в г д к л м н п р с т"), _split("а е и о у ы я"), ("", *_split("н р л с"))),
    Namer("katakana", ("",), _split("カ キ ク ケ コ サ シ ス タ ナ ニ ハ マ ミ ム ラ リ ル レ ロ"), ("", "ン"), (2, 4)),
)  # fmt: skip
HELD_OUT = (
    Namer("latin-other", _split("h j w y x q ch sh ph wh"), _split("ee oo ay ie ui eu"), ("", *_split("x ck ng sh")),
          (1, 3)),
    Namer("diacritics-other", _split("ř ď ť ğ ş ż"), _split("ě ů ő ű ā ē ī ō"), ("", *_split("ķ ļ ņ"))),
    Namer("greek", _split("β γ δ θ κ λ μ ν π ρ σ τ φ χ"), _split("α ε η ι ο υ ω"), ("", "ς", "ν")),
    Namer("han", ("",), _split("李 王 张 刘 陈 杨 黄 赵 吴 周 徐 孙 马 朱 胡 郭 何 高 林 罗 明 华 文 光"), ("",)),
)  # fmt: skip
# Jobs, lower-case, and the kinds of company: each split its own.
JOB_NAMERS = {
    "training": Namer("jobs", _split("b d f g k l m n p r s t v z"), _split("a e i o u"), ("", *_split("n r l s")),
                      (2, 3), capital=False),
    "held_out": Namer("jobs-other", _split("h j w y ch sh"), _split("ee oo ay ie"), ("", *_split("x ck ng")), (2, 3),
                      capital=False),
}  # fmt: skip
ORG_KINDS = {
    "training": ("Labs", "Group", "Systems", "Works", "Partners", "Foundry", "Dynamics"),
    "held_out": ("Holdings", "Collective", "Ventures", "Cooperative", "Guild"),
}


class OpenWorld:
    """``pools.World``'s people, cities and companies, with names from a split's namers (``training`` or
    ``held_out``), each unique within one example. A person's first and last names come from one namer."""

    def __init__(self, rng: random.Random, split: str) -> None:
        if split not in ORG_KINDS:
            raise ValueError(f"split must be 'training' or 'held_out', not {split!r}")
        self.rng, self.split = rng, split
        self.namers = TRAINING if split == "training" else HELD_OUT
        self.used: set[str] = set()

    def _fresh(self, make) -> str:
        while True:
            w = make()
            if w not in self.used and not any(w in u or u in w for u in self.used):
                self.used.add(w)
                return w

    def person(self) -> str:
        namer = self.rng.choice(self.namers)
        first = self._fresh(lambda: namer.word(self.rng))
        return f"{first} {self._fresh(lambda: namer.word(self.rng))}"

    def _word(self) -> str:
        """A fresh word from any of the split's namers."""
        return self._fresh(lambda: self.rng.choice(self.namers).word(self.rng))

    def city(self) -> str:
        return self._word()

    def org(self) -> str:
        return f"{self._word()} {self.rng.choice(ORG_KINDS[self.split])}"

    def role(self) -> str:
        return self._fresh(lambda: JOB_NAMERS[self.split].word(self.rng))

    def product(self) -> str:
        return f"{self._word()} {self.rng.choice(PRODUCT_KINDS)}"

    def pet_name(self) -> str:
        return self._word()


def _chars(*spans: tuple[int, int]) -> str:
    return "".join(chr(c) for lo, hi in spans for c in range(lo, hi + 1))


@dataclass(frozen=True)
class Scrambler:
    """Words of ``length`` (inclusive range) characters drawn from ``alphabet`` in no order."""

    label: str
    alphabet: str
    length: tuple[int, int] = (3, 8)
    capital: bool = False

    def word(self, rng: random.Random) -> str:
        w = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(*self.length)))
        return w[:1].upper() + w[1:] if self.capital else w


_HELD_OUT_CHARS = {
    x for n in (*HELD_OUT, JOB_NAMERS["held_out"]) for piece in n.pieces for c in piece if ord(c) > 127
    for x in (c, c.upper(), c.lower())
}  # fmt: skip
SCRAMBLED = tuple(
    Scrambler(label, "".join(c for c in alphabet if c not in _HELD_OUT_CHARS), length, capital)
    for label, alphabet, length, capital in (
        ("ascii", _chars((0x61, 0x7A)), (3, 9), True),
        ("latin-1", _chars((0xE0, 0xF6), (0xF8, 0xFF), (0x61, 0x7A)), (3, 8), True),
        ("latin-extended", _chars((0x100, 0x17F)), (3, 7), False),
        ("cyrillic", _chars((0x430, 0x44F)), (3, 7), True),
        ("armenian", _chars((0x561, 0x586)), (3, 6), False),
        ("hebrew", _chars((0x5D0, 0x5EA)), (3, 6), False),
        ("arabic", _chars((0x628, 0x63A), (0x641, 0x64A)), (3, 6), False),
        ("devanagari", _chars((0x915, 0x939)), (2, 5), False),
        ("thai", _chars((0xE01, 0xE2E)), (2, 5), False),
        ("georgian", _chars((0x10D0, 0x10F0)), (3, 6), False),
        ("hangul", _chars((0xAC00, 0xD7A3)), (2, 3), False),
        ("hiragana", _chars((0x3041, 0x3093)), (2, 4), False),
        (
            "greek-other",
            _chars(
                (0x386, 0x386),
                (0x388, 0x38A),
                (0x38C, 0x38C),
                (0x38E, 0x38F),
                (0x3AA, 0x3AF),
                (0x3B6, 0x3B6),
                (0x3BE, 0x3BE),
                (0x3C8, 0x3C8),
                (0x3CA, 0x3CE),
                (0x3E2, 0x3EF),
            ),
            (3, 6),
            False,
        ),
        ("han-other", _chars((0x4E00, 0x9FFF)), (2, 3), False),
    )
)
