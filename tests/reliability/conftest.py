"""The reliability suite's oracle: whatever the cache holds or the disk does, an answer equals the one a
cache-less engine gives for the same prompt (cold and warm composed answers are equal, docs/design.md §6)."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment

DOCS = [
    "Stithgo Dithgaith lives in Kothvenville and works as a pilot at Krudrel Labs.",
    "Ana Lee lives in Oslo and works as a baker; she has two cats and a bicycle.",
    "Bo Ek lives in Rome and works as a nurse at the city hospital near the river.",
]
QUESTION = "Where does Bo Ek live?"


def engine(**options) -> Engine:
    """The bundled model, every segment cached."""
    return Engine.from_pretrained(**{"min_cached_tokens": 1, **options})


@pytest.fixture(scope="package")
def oracle():
    """``oracle(docs, question)``: next-token logits of a fresh engine with no cache at all."""
    bare = engine()

    def logits(docs=DOCS, question=QUESTION) -> torch.Tensor:
        bare.clear_cache()
        return bare.prompt_logits([Segment(d) for d in docs], question)

    return logits


def segments(docs=DOCS) -> list[Segment]:
    return [Segment(d) for d in docs]


def same(logits: torch.Tensor, expected: torch.Tensor) -> bool:
    """The same answer: the same next token, logits within float noise (a miss prefilled alone or in a batch
    of others differs in the last bits)."""
    return int(logits.argmax()) == int(expected.argmax()) and float((logits - expected).abs().max()) < 1e-4
