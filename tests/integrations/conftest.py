from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.integrations.prompting import REGISTRY


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The bundled model; its short documents are cached whatever their length, so hits show."""
    return Engine.from_pretrained(min_cached_tokens=1)


@pytest.fixture(autouse=True)
def fresh_registry():
    REGISTRY.clear()
    yield
    REGISTRY.clear()
