"""The fleet in operation: a replica killed mid-stream, Ray Serve's autoscaling, and one view of its metrics.

Each test runs a fleet of its own on the package's loopback Ray cluster, and bounds every wait.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import MODEL, fleet

pytestmark = pytest.mark.ray

NAMES = ["Ana Lee", "Bo Ek", "Cy Orr", "Di Park", "Ed Sol", "Fa Tam", "Gus Ng", "Hal Vo"]
CITIES = ["Oslo", "Rome", "Lima", "Pune", "Kiev", "Baku", "Cork", "Nice"]


def question(i: int) -> list[dict]:
    name, city = NAMES[i % len(NAMES)], CITIES[(i * 3) % len(CITIES)]
    text = f"{name} lives in {city} and works shift {i}. Where does {name} live, and which shift?"
    return [{"role": "user", "content": text}]


@dataclass
class Stream:
    """One streamed answer as a client saw it."""

    replica: str = ""
    status: int = 0
    text: str = ""
    error: dict | None = None
    done: bool = False
    headers: dict = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        if self.status != 200:
            return "failed"
        if self.error is not None:
            return "broken"
        return "answered" if self.done else "cut"


def stream(
    client: httpx.Client, url: str, messages: list[dict], max_tokens: int, seen: Stream, **extra: object
) -> Stream:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        seen.status, seen.headers = response.status_code, dict(response.headers)
        seen.replica = response.headers.get("x-hypic-replica", "")
        if response.status_code != 200:
            response.read()
            return seen
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                seen.done = seen.error is None
                break
            event = json.loads(line[6:])
            if "error" in event:
                seen.error = event["error"]
                continue
            for choice in event.get("choices", ()):
                seen.text += choice.get("delta", {}).get("content") or ""
    return seen


def view(url: str) -> dict:
    return httpx.get(url + "/fleet", timeout=30).json()


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds:.0f} s: {what}")


# Every answer runs to its token limit (forty words cannot end sooner), so a stream is mid-way for most of its
# life: the bundled model answers some of these questions in one token, which leaves no moment to kill it in.
LONG = {"response_format": {"type": "regex", "regex": "[a-z]+( [a-z]+){40}"}}


def test_a_replica_killed_mid_stream_loses_only_its_own_streams_and_comes_back(proxy, reference):
    requests, tokens = 16, 24
    alone = [reference.chat(question(i), max_new_tokens=tokens, temperature=0.0, **LONG).text for i in range(requests)]
    with contextmanager(fleet)(proxy, "kill") as url, httpx.Client() as client:
        first = stream(client, url, question(0), 2, Stream(), **LONG)
        assert first.outcome == "answered"
        replicas = wait_for(lambda: len(view(url)["replicas"]) == 2 and view(url)["replicas"], 30, "two reports")
        victim = next(r for r in replicas if r["replica"] == first.replica)
        streams = [Stream() for _ in range(requests)]
        killed = threading.Event()

        def killer() -> None:  # once a stream of the victim's has sent tokens and is still going
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if any(s.replica == victim["replica"] and s.text and not s.done for s in streams):
                    os.kill(victim["pid"], signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.01)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: stream(client, url, question(i), tokens, streams[i], **LONG), range(requests)))
        thread.join(timeout=60)
        assert killed.is_set()
        outcomes = [s.outcome for s in streams]
        assert set(outcomes) <= {"answered", "broken", "failed"} and "broken" in outcomes
        for i, s in enumerate(streams):
            if s.outcome == "answered":
                assert s.text == alone[i]  # whoever answered it, retried or not: the same answer as alone
            elif s.outcome == "broken":
                assert s.replica == victim["replica"]  # only the dead replica's streams break
                assert s.error["code"] == "replica_failed" and s.error["retryable"] is True
                assert alone[i].startswith(s.text)  # what it had sent was right
            else:
                assert s.status == 503 and s.headers.get("retry-after")
        counts = view(url)["requests"]
        assert counts.get("broken", 0) == outcomes.count("broken")
        assert counts.get("failed", 0) == outcomes.count("failed")
        print(
            f"killed {victim['replica']}: {outcomes.count('answered')} answered "
            f"({counts.get('retried', 0)} retried on the other replica), {outcomes.count('broken')} broken, "
            f"{outcomes.count('failed')} failed"
        )

        # Ray Serve starts a replacement; the router forgot the dead one and routes to the new one
        def replacement() -> set[str]:
            now = {r["replica"] for r in view(url)["replicas"]}
            return now - {victim["replica"]} if len(now) == 2 and victim["replica"] not in now else set()

        fresh = wait_for(replacement, 120, "a replacement replica") - {first.replica}
        answered_by: set[str] = set()
        for i in range(32):
            after = stream(client, url, question(i), 4, Stream(), **LONG)
            assert after.outcome == "answered" and alone[i % requests].startswith(after.text)
            answered_by.add(after.replica)
            if fresh <= answered_by:
                break
        assert fresh <= answered_by


def metric(text: str, name: str) -> dict[tuple, float]:
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_the_fleets_metrics_sum_its_replicas_and_match_the_answers(proxy):
    docs = [f"Note {i}: {NAMES[i]} keeps the key to room {100 + i} in a blue box by the door." for i in range(8)]

    def body(i: int) -> dict:
        # request i + 2 (the same replica, round robin) begins with request i's second document: a segment hit,
        # never a prompt that begins as an earlier one does (whose kept state it would restore instead)
        parts = [
            {"type": "text", "text": docs[(i // 2 + j) % 8] + "\n\n", "hypic": {"kind": "document"}} for j in range(2)
        ]
        ask = {"type": "text", "text": f"Who keeps the key to room {100 + i % 8}?"}
        return {"model": MODEL, "messages": [{"role": "user", "content": [*parts, ask]}], "max_tokens": 2}

    # round-robin: both replicas answer (and hit) whatever affinity would make of so few documents
    metrics_fleet = contextmanager(fleet)(proxy, "metrics", min_cached_tokens=1, policy="round_robin")
    with metrics_fleet as url, httpx.Client(timeout=120) as client:
        answers = [client.post(url + "/v1/chat/completions", json=body(i)).json() for i in range(16)]
        hits = sum(a["hypic"]["hit_segments"] for a in answers)
        time.sleep(3)  # the replicas' next reports carry their metrics
        text = httpx.get(url + "/metrics").text
    per_replica: dict[tuple, float] = {}
    summed: dict[tuple, float] = {}
    for labels, value in metric(text, "hypic_segment_hits_total").items():
        rest = tuple(kv for kv in labels if kv[0] != "replica")
        (per_replica if len(rest) < len(labels) else summed)[rest] = (
            per_replica.get(rest, 0.0) + value if len(rest) < len(labels) else value
        )
    assert summed and summed == per_replica  # the fleet's series is the sum of the replicas'
    assert sum(summed.values()) == hits  # and counts what the answers said they hit
    assert len({kv for labels in metric(text, "hypic_segment_hits_total") for kv in labels if kv[0] == "replica"}) == 2
    lookups = metric(text, "hypic_segment_lookups_total")
    fleet_hits = lookups[(("kind", "document"), ("outcome", "hit"))]
    fleet_total = fleet_hits + lookups.get((("kind", "document"), ("outcome", "miss")), 0.0)
    ratio = metric(text, "hypic_cache_hit_ratio")[(("kind", "document"),)]
    assert ratio == pytest.approx(fleet_hits / fleet_total)  # the fleet's ratio: its hits over its lookups


def test_autoscaling_adds_a_replica_under_load_and_drains_one_without_cutting_a_request(proxy):
    load_clients = 4
    scaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0.5,
        "downscale_delay_s": 3,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2,
    }
    with contextmanager(fleet)(proxy, "scale", autoscaling=scaling) as url, httpx.Client() as client:
        first = stream(client, url, question(0), 2, Stream())  # the router starts with the first request
        assert first.outcome == "answered"
        wait_for(lambda: [r["replica"] for r in view(url)["replicas"]] == [first.replica], 30, "one replica at first")
        loaded: list[Stream] = []
        stop = threading.Event()

        def load(c: int) -> None:
            i = c
            while not stop.is_set():
                loaded.append(stream(client, url, question(i), 32, Stream()))
                i += load_clients

        start = time.monotonic()
        with ThreadPoolExecutor(load_clients) as pool:
            running = [pool.submit(load, c) for c in range(load_clients)]
            try:
                wait_for(
                    lambda: any(s.replica and s.replica != first.replica for s in loaded),
                    120,
                    "a request on an added replica",
                )
            finally:
                stop.set()
        for future in running:
            future.result()  # a client that failed fails the test
        added = time.monotonic() - start
        assert all(s.outcome == "answered" for s in loaded)

        trickle: list[Stream] = []  # load falls to one client: a replica drains while requests keep coming

        def down() -> bool:
            trickle.append(stream(client, url, question(len(trickle)), 8, Stream()))
            return len(view(url)["replicas"]) == 1

        start = time.monotonic()
        wait_for(down, 120, "a replica drained")
        drained = time.monotonic() - start
        for _ in range(3):
            trickle.append(stream(client, url, question(len(trickle)), 8, Stream()))
        assert all(s.outcome == "answered" for s in trickle)  # no request cut while it drained
        assert view(url)["requests"].get("broken", 0) == view(url)["requests"].get("failed", 0) == 0
        print(
            f"scaled up after {added:.1f} s ({len(loaded)} requests from {load_clients} clients), down after "
            f"{drained:.1f} s ({len(trickle)} requests from one client, answered by "
            f"{len({s.replica for s in trickle})} replicas); none cut"
        )
