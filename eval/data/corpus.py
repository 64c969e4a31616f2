"""The retrieval corpus of the demo, the examples and the integration tests: facts about fictional
people from the workloads' pools, one fact per document, with the question each fact answers."""

from __future__ import annotations

import random

from .pools import FIRST_NAMES, World
from .workloads import PERSON_QUESTIONS, person_doc, person_facts


def corpus(people: int, seed: int) -> tuple[list[str], list[tuple[str, str]]]:
    """A retrieval corpus for the demo and the integrations: a knowledge base chunked one fact per
    document (plain text: a chat template wraps each piece), four facts per person, and every
    question the facts answer (``qa[4 * person + k]`` asks about ``texts[4 * person + k]``)."""
    if not 1 <= people <= len(FIRST_NAMES):
        raise ValueError(f"people must be between 1 and {len(FIRST_NAMES)}, got {people}")
    rng = random.Random(f"corpus:{seed}")
    w = World(rng)
    persons = [person_doc(w, rng) for _ in range(people)]
    qa = [(q.format(name=p["name"]), str(p[k])) for p in persons for k, q in PERSON_QUESTIONS]
    return [person_facts(p)[k] for p in persons for k, _ in PERSON_QUESTIONS], qa
