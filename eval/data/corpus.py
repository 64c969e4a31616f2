"""The retrieval corpus of the demo, the examples and the integration tests: facts about fictional
people from the workloads' pools, with the question each fact answers."""

from __future__ import annotations

import random

from .pools import FIRST_NAMES, World
from .workloads import PERSON_QUESTIONS, person_doc, person_facts


def corpus(people: int, seed: int, *, profiles: bool = False) -> tuple[list[str], list[tuple[str, str]]]:
    """A knowledge base about ``people`` people (plain text: a chat template wraps each piece) and every
    question its facts answer, four per person (``qa[4 * person + k]``, attributes as ``PERSON_QUESTIONS``).

    Chunked one fact per document by default (``qa[i]`` asks about ``texts[i]``); with ``profiles``, one
    document of a few sentences per person, their four facts in a seeded order (``qa[i]`` asks about
    ``texts[i // 4]``): the shape of the demo, long enough that reusing a cached document saves more than
    it costs on the bundled model."""
    if not 1 <= people <= len(FIRST_NAMES):
        raise ValueError(f"people must be between 1 and {len(FIRST_NAMES)}, got {people}")
    rng = random.Random(f"corpus:{seed}")
    w = World(rng)
    persons = [person_doc(w, rng) for _ in range(people)]
    qa = [(q.format(name=p["name"]), str(p[k])) for p in persons for k, q in PERSON_QUESTIONS]
    facts = [[person_facts(p)[k] for k, _ in PERSON_QUESTIONS] for p in persons]
    if not profiles:
        return [f for fs in facts for f in fs], qa
    order = random.Random(f"profiles:{seed}")
    return [" ".join(order.sample(fs, len(fs))) for fs in facts], qa
