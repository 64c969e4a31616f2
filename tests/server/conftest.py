from __future__ import annotations

from collections.abc import Iterator

import pytest

from hypic_rag import Engine
from hypic_rag.server import create_app
from hypic_rag.testing.server import free_port, serve_in_thread

MODEL = "hypic-default"


def pytest_generate_tests(metafunc):
    """Tests marked ``fleet`` run twice: against one process, and against a two-replica Ray Serve fleet
    (``hypic-rag serve --replicas 2``), whose answers, errors and streams must be the same."""
    if "server" in metafunc.fixturenames:
        kinds: list = ["process"]
        if metafunc.definition.get_closest_marker("fleet"):
            kinds.append(pytest.param("fleet", marks=pytest.mark.ray))
        metafunc.parametrize("server", kinds, indirect=True, scope="package")


@pytest.fixture(scope="package")
def engine() -> Engine:
    return Engine.from_pretrained()


@pytest.fixture(scope="package")
def reference() -> Engine:
    """A second engine on the same checkpoint, for answers computed in-process, one at a time."""
    return Engine.from_pretrained()


@pytest.fixture(scope="package")
def proxy() -> str:
    """One local Ray cluster (loopback) and Ray Serve's proxy on a free port, for every fleet in the package."""
    from hypic_rag.fleet.launch import serve_proxy

    with serve_proxy(port=free_port(), cpus=4) as url:
        yield url


def fleet(proxy: str, name: str, **options) -> Iterator[str]:
    """A fleet of two replicas of the bundled model, one thread each, under ``/name`` of the proxy."""
    from hypic_rag.fleet.deployment import build_app
    from hypic_rag.fleet.launch import deployed

    app = build_app(None, replicas=2, threads=1, replica_cpus=1.0, name=MODEL, **options)
    with deployed(app, name=name, route_prefix=f"/{name}"):
        yield f"{proxy}/{name}"


@pytest.fixture(scope="package")
def server(request) -> str:
    """The bundled model served on a free loopback port (by one process, or by a fleet); its base URL."""
    if request.param == "fleet":
        yield from fleet(request.getfixturevalue("proxy"), "fleet", max_queue=32)
        return
    engine = request.getfixturevalue("engine")
    with serve_in_thread(create_app(engine, model_names=[MODEL], max_queue=32)) as url:
        yield url


@pytest.fixture
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c
