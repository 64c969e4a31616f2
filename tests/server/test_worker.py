"""The engine worker's shadow runs: a share of requests run again in ``full`` once the worker is idle, their
KL exported, never on a request's critical path and never changing an answer."""

from __future__ import annotations

import threading

import httpx
import pytest

from hypic_rag import Engine
from hypic_rag.server import create_app
from hypic_rag.server.worker import EngineWorker
from hypic_rag.testing.server import serve_in_thread

DOCUMENTS = [
    "Ana Lee lives in Oslo and works as a pilot at Nordfly Systems.",
    "Bo Ek lives in Rome and works as a baker at Forno Labs since 2019.",
]
MESSAGES = [
    {"role": "system", "content": "Answer from the documents."},
    {
        "role": "user",
        "content": [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in DOCUMENTS]
        + [{"type": "text", "text": "Where does Ana Lee live?"}],
    },
]


def _ask(url: str) -> dict:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "hypic": {"seam": 4}}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()


def test_shadow_runs_after_the_answer_and_changes_nothing(monkeypatch):
    engine = Engine.from_pretrained()
    release, shadow_started = threading.Event(), threading.Event()
    modes: list[str] = []
    start_chat = engine.start_chat

    def spy(*args, options=None, **kwargs):
        modes.append(options.mode)
        if options.mode == "full":  # the shadow waits until the test has the answer in hand
            shadow_started.set()
            assert release.wait(60)
        return start_chat(*args, options=options, **kwargs)

    monkeypatch.setattr(engine, "start_chat", spy)
    with serve_in_thread(create_app(engine, model_names=["m"], shadow_rate=1.0)) as url:
        first = _ask(url)  # answered while its shadow may not even have started: nothing waits for it
        assert shadow_started.wait(60)  # the worker is idle now, so the shadow runs, and blocks
        release.set()
        second = _ask(url)
        assert first["choices"][0]["message"] == second["choices"][0]["message"]
        assert first["hypic"]["segments"] >= 3
        text = ""
        for _ in range(200):
            text = httpx.get(url + "/metrics").text
            if 'hypic_shadow_kl_count{mode="hypic"} 2.0' in text:
                break
            threading.Event().wait(0.05)
        assert 'hypic_shadow_kl_count{mode="hypic"} 2.0' in text
    assert modes == ["hypic", "full", "hypic", "full"]
    with serve_in_thread(create_app(Engine.from_pretrained(), model_names=["m"])) as url:
        unshadowed = _ask(url)  # the same request where nothing is shadowed
    assert first["choices"][0]["message"] == unshadowed["choices"][0]["message"]


def test_shadow_rate_is_off_by_default_and_checked():
    engine = Engine.from_pretrained()
    assert EngineWorker(engine).shadow_rate == 0.0
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="shadow_rate"):
            EngineWorker(engine, shadow_rate=bad)


def test_a_guarded_request_exports_its_estimate():
    engine = Engine.from_pretrained(fidelity_budget=1e9)
    with serve_in_thread(create_app(engine, model_names=["m"])) as url:
        answer = _ask(url)
        assert answer["choices"][0]["message"]["content"] is not None
        text = httpx.get(url + "/metrics").text
    assert 'hypic_fidelity_estimate_count{mode="hypic"} 1.0' in text
    assert 'hypic_fidelity_actions_total{action="none"} 1.0' in text
