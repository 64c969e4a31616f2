"""The live-server load test: its QPS search, its replay of the simulator, and a tiny run over real HTTP."""

from __future__ import annotations

import sys

from hypic_rag.eval.bench.server import concurrency, live_max_qps, run
from hypic_rag.eval.bench.slo import Traffic
from hypic_rag.testing.synthetic import TINY


def test_the_live_search_brackets_its_guess_then_bisects():
    for threshold, guess in ((1.0, 0.5), (1.0, 3.0), (0.2, 1.0)):
        found, tried = live_max_qps(lambda q, t=threshold: q <= t, guess, probes=8, log=lambda _: None)
        assert len(tried) == 8 and found <= threshold
        assert found > threshold * 0.9  # eight probes close in on it
    assert live_max_qps(lambda q: False, 1.0, probes=3, log=lambda _: None)[0] == 0.0


def test_a_tiny_run_over_http_reports_live_and_simulated_qps():
    report = run(
        Traffic(corpus=12, k=2, doc_tokens=16, query_tokens=4),
        layers=2,
        requests=8,
        warmup=4,
        probes=2,
        repeats=1,
        sim_requests=200,
        shapes=TINY,
        log=lambda _: None,
    )
    assert set(report["results"]) == {"full", "prefix", "hypic"}
    for mode, row in report["results"].items():
        assert len(row["probes"]) == 2 and all(not p["errors"] for p in row["probes"]), mode
        assert all(p["p90_ttft_s"] > 0 and p["predicted_p90_ttft_s"] > 0 for p in row["probes"])
    assert all(len(v) == 3 for v in report["service_ttft_s"].values())
    assert report["bytes_per_entry"]["hypic"] > 0 and report["bytes_per_entry"]["prefix"] > 0


def test_answers_of_many_tokens_are_held_to_a_tpot_slo_too():
    report = run(
        Traffic(corpus=12, k=2, doc_tokens=16, query_tokens=4),
        layers=2,
        requests=6,
        warmup=2,
        probes=1,
        repeats=1,
        sim_requests=100,
        shapes=TINY,
        log=lambda _: None,
        max_tokens=4,
    )
    assert report["max_tokens"] == 4 and report["tpot_slo_s"] > 0
    for mode, row in report["results"].items():
        [probe] = row["probes"]
        assert probe["p90_tpot_s"] > 0, mode
        assert probe["ok"] == (
            not probe["errors"]
            and probe["p90_ttft_s"] <= report["slo_s"]
            and probe["p90_tpot_s"] <= report["tpot_slo_s"]
        )


def test_concurrency_reports_each_max_active():
    report = concurrency(
        layers=2,
        clients=4,
        max_tokens=24,  # answers long enough that four sent at once overlap in the batched run
        actives=(1, 2),
        traffic=Traffic(corpus=12, k=2, doc_tokens=16, query_tokens=4),
        shapes=TINY,
        log=lambda _: None,
    )
    assert set(report["runs"]) == {"1", "2"}
    for row in report["runs"].values():
        assert 0 < row["mean_ttft_s"] <= row["max_ttft_s"] <= row["wall_s"] + 1e-6
        assert 4 <= row["generated_tokens"] <= 96  # every answer has at least its first token
        if sys.platform.startswith("linux"):  # read from the server's process_cpu_seconds_total (/proc)
            assert row["server_cpu_s"] > 0
    if sys.platform.startswith("linux"):
        assert report["tokens_per_server_cpu_s_ratio"] > 0
    assert report["runs"]["2"]["answers_equal_to_max_active_1"] == "4/4"  # batched answers are the ones alone
    assert report["runs"]["2"]["mean_batch_size"] > 1


def test_two_replicas_share_documents_only_through_redis():
    from hypic_rag.eval.bench.server import replicas

    report = replicas(
        layers=2,
        requests=12,
        traffic=Traffic(corpus=6, k=2, doc_tokens=16, query_tokens=4),
        shapes=TINY,
        log=lambda _: None,
    )
    separate, shared = report["runs"]["separate"], report["runs"]["shared_redis"]
    assert shared["hit_ratio"] > separate["hit_ratio"]  # each replica also finds what the other prefilled
