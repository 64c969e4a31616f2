"""The routing simulator: its traffic is what it says, its oracle bounds, and the router's code keeps its load
bound and its affinity under it."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.fleet_sim import ONE_TOPIC, POLICIES, make_traffic, oracle_bound, simulate, simulate_closed
from hypic_rag.fleet.routing import EPSILON


def test_the_traffic_is_what_it_says():
    clustered = make_traffic("clustered", 400, 8, 4, 0.9, 200, seed=1)
    assert all(len({d // 8 for d in r}) == 1 and len(set(r)) == 4 for r in clustered.requests)
    assert any(list(r) != sorted(r) for r in clustered.requests)
    fixed = make_traffic("fixed_order", 400, 8, 4, 0.9, 200, seed=1)
    assert all(list(r) == sorted(r) for r in fixed.requests)
    independent = make_traffic("independent", 400, 8, 4, 0.9, 200, seed=1)
    assert all(len(set(r)) == 4 for r in independent.requests)
    assert len({d // 8 for r in independent.requests for d in r}) > 20
    assert sum(clustered.mass) == pytest.approx(4.0)


def test_the_oracle_bound_grows_with_the_room_to_one():
    traffic = make_traffic("clustered", 400, 8, 4, 0.9, 10, seed=0)
    bounds = [oracle_bound(traffic, held) for held in (0, 40, 80, 400)]
    assert bounds[0] == 0 and bounds[-1] == pytest.approx(1.0) and bounds == sorted(bounds)
    assert bounds[1] > 40 / 400  # popular documents first: more than their share of the pool


def test_affinity_keeps_the_load_bound_and_beats_the_blind_policies_on_clustered_traffic():
    traffic = make_traffic("clustered", 800, 8, 4, 0.9, 4000, seed=0)
    runs = {p: simulate(p, traffic, 4, 40, 4, 32, 1000, 0.25, 10, 0) for p in POLICIES}
    assert runs["affinity"]["over_bound_decisions"] == 0
    assert runs["affinity"]["hit_ratio"] > 1.2 * runs["power_of_two"]["hit_ratio"]
    assert runs["affinity"]["hit_ratio"] > 1.2 * runs["round_robin"]["hit_ratio"]
    assert all(0 <= r["hit_ratio"] <= 1 and 0 < r["largest_share"] <= 1 for r in runs.values())


def test_in_a_closed_loop_affinity_keeps_its_documents_and_spreads_a_hot_topic():
    clustered = make_traffic("clustered", 200, 8, 4, 0.9, 800, seed=0)
    runs = {p: simulate_closed(p, clustered, 2, 50, 4, 400) for p in ("affinity", "power_of_two")}
    assert runs["affinity"]["over_bound_decisions"] == 0
    assert runs["affinity"]["hit_ratio"] > 1.2 * runs["power_of_two"]["hit_ratio"]
    assert runs["affinity"]["mean_latency"] < runs["power_of_two"]["mean_latency"]  # hits answer sooner
    hot = make_traffic(ONE_TOPIC, 200, 8, 4, 0.9, 800, seed=0)
    assert all(set(r) <= set(range(8)) for r in hot.requests)
    spread = simulate_closed("affinity", hot, 2, 50, 4, 400)
    assert spread["hit_ratio"] == 1.0 and spread["largest_share"] <= (1 + EPSILON) / 2
