from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.server import create_app
from hypic_rag.testing.server import serve_in_thread

MODEL = "hypic-default"


@pytest.fixture(scope="package")
def engine() -> Engine:
    return Engine.from_pretrained()


@pytest.fixture(scope="package")
def reference() -> Engine:
    """A second engine on the same checkpoint, for answers computed in-process, one at a time."""
    return Engine.from_pretrained()


@pytest.fixture(scope="package")
def server(engine) -> str:
    """The bundled model served on a free loopback port; its base URL."""
    with serve_in_thread(create_app(engine, model_names=[MODEL], max_queue=32)) as url:
        yield url


@pytest.fixture
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c
