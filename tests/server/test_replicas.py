"""Two server replicas sharing the Redis tier: a document first seen by one is a hit on the other."""

from __future__ import annotations

import httpx

from hypic_rag import Engine
from hypic_rag.server import create_app
from hypic_rag.testing.redis import RedisServer
from hypic_rag.testing.server import serve_in_thread

from .conftest import MODEL

DOCS = ["Ana Lee has lived in Oslo since 2019.", "Bo Ek has lived in Rome since 2015.", "Cy Ru moved to Lima."]


def _body(docs):
    parts = [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in docs]
    return {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "Who lives in Rome?"}]}],
    }


def test_a_document_first_seen_by_replica_a_is_a_hit_on_replica_b(tmp_path):
    with RedisServer(tmp_path / "redis") as redis:
        a = Engine.from_pretrained(cache_url=redis.url)
        b = Engine.from_pretrained(cache_url=redis.url)
        with (
            serve_in_thread(create_app(a, model_names=[MODEL])) as url_a,
            serve_in_thread(create_app(b, model_names=[MODEL])) as url_b,
        ):
            first = httpx.post(url_a + "/v1/chat/completions", json=_body(DOCS), timeout=60).json()
            assert first["hypic"]["hit_segments"] == 0
            a.segment_store.remote.flush()  # A's entries reach Redis in the background
            second = httpx.post(url_b + "/v1/chat/completions", json=_body(DOCS[::-1]), timeout=60).json()
            assert second["hypic"]["hit_segments"] == 3 and second["hypic"]["remote_hits"] >= 3
            assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            metrics = httpx.get(url_b + "/metrics").text
            assert 'hypic_tier_hits_total{tier="remote"}' in metrics and 'hypic_cache_bytes{tier="remote"}' in metrics
