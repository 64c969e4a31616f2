"""The fleet's routing policy: bounded load, order independence, determinism, belief from routes and reports."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypic_rag.fleet.routing import (
    BURST,
    AffinityPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    home,
    make_policy,
)

REPLICAS = ["r0", "r1", "r2", "r3"]
keys_st = st.lists(st.text("abcdef0123", min_size=1, max_size=6), max_size=8, unique=True)
replicas_st = st.lists(st.sampled_from(REPLICAS), min_size=1, max_size=4, unique=True)
load_st = st.dictionaries(st.sampled_from(REPLICAS), st.integers(0, 12))
epsilon_st = st.sampled_from([0.05, 0.25, 1.0])


@given(replicas_st, keys_st, load_st, epsilon_st, st.lists(st.tuples(st.sampled_from(REPLICAS), keys_st)))
def test_the_chosen_replica_is_always_under_its_bound(replicas, keys, load, epsilon, history):
    policy = AffinityPolicy(epsilon)
    for replica, routed in history:  # whatever it believes and whatever the shares, the bounds hold
        policy.routed(replica, routed)
    bounds = policy.bounds(load, replicas)
    choice = policy.choose(replicas, keys, load, "request-1")
    first = choice.ranked[0]
    assert sorted(choice.ranked) == sorted(replicas)
    assert load.get(first, 0) < bounds[first]
    mean = (sum(load.get(r, 0) for r in replicas) + 1) / len(replicas)
    assert load.get(first, 0) + 1 <= math.ceil((1 + max(BURST, epsilon)) * mean)  # after taking it, never more
    fair = (1 + epsilon) / len(replicas)
    if policy.shares(replicas)[first] > fair:  # a replica above its share of recent requests: the tight bound
        assert load.get(first, 0) + 1 <= math.ceil((1 + epsilon) * mean)


def test_a_replica_within_its_share_bursts_and_one_above_it_does_not():
    policy = AffinityPolicy(epsilon=0.5)
    for i in range(40):  # alternate: each holds half of the recent requests
        policy.routed(["r0", "r1"][i % 2], [f"t{i % 2}"])
    # 4 in flight with this one, tight bound ceil(1.5 * 4 / 2) = 3, burst bound ceil(2 * 4 / 2) = 4
    assert policy.bounds({"r0": 3}, ["r0", "r1"]) == {"r0": 4, "r1": 4}
    assert policy.choose(["r0", "r1"], ["t0"], {"r0": 3}, "t").ranked[0] == "r0"  # its keys, a burst
    for _ in range(40):  # now r0 took most of what was routed lately: a hot spot
        policy.routed("r0", ["t0"])
    assert policy.shares(["r0", "r1"])["r0"] > 0.75
    assert policy.bounds({"r0": 3}, ["r0", "r1"]) == {"r0": 3, "r1": 4}
    assert policy.choose(["r0", "r1"], ["t0"], {"r0": 3}, "t").ranked[0] == "r1"


def test_a_share_fades_as_other_replicas_take_the_requests():
    policy = AffinityPolicy()
    for _ in range(20):
        policy.routed("r0", ["a"])
    policy.routed("r1", ["b"])
    before = policy.shares(["r0", "r1"])["r0"]
    for _ in range(200):
        policy.routed("r1", ["b"])
    assert policy.shares(["r0", "r1"])["r0"] < before / 4
    policy.forget("r1")
    assert policy.shares(["r0", "r1"]) == {"r0": 1.0, "r1": 0.0}


@given(replicas_st, keys_st, load_st, st.randoms(use_true_random=False))
def test_the_choice_does_not_depend_on_key_order_and_is_the_same_every_time(replicas, keys, load, rng):
    policy = AffinityPolicy()
    policy.routed(replicas[0], keys[: len(keys) // 2])
    shuffled = list(keys)
    rng.shuffle(shuffled)
    first = policy.choose(replicas, keys, load, "t")
    assert policy.choose(replicas, shuffled, load, "t") == first
    assert (
        AffinityPolicy().choose(replicas, keys, load, "t").ranked[0]
        == AffinityPolicy().choose(replicas, shuffled, load, "t").ranked[0]
    )


def test_a_request_goes_where_its_keys_were_routed_until_that_replica_is_full():
    policy = AffinityPolicy(epsilon=0.25)
    policy.routed("r2", ["a", "b", "c"])
    choice = policy.choose(REPLICAS, ["c", "b", "a", "z"], {}, "t")
    assert (choice.ranked[0], choice.reason, choice.believed) == ("r2", "affinity", 3)
    # r2 has 2 in flight, the others none: 3 in flight with this one, bound ceil(1.25 * 3 / 4) = 1
    busy = policy.choose(REPLICAS, ["a", "b", "c"], {"r2": 2}, "t")
    assert busy.ranked[0] != "r2" and busy.ranked[-1] == "r2" and busy.reason == "load_bound"


def test_no_cached_keys_go_to_the_least_loaded():
    policy = AffinityPolicy()
    choice = policy.choose(REPLICAS, [], {"r0": 3, "r1": 1, "r2": 0, "r3": 2}, "t")
    assert (choice.ranked[0], choice.reason) == ("r2", "least_loaded")


def test_keys_seen_first_go_to_their_rendezvous_home():
    policy = AffinityPolicy()
    choice = policy.choose(REPLICAS, ["k1"], {}, "t")
    assert (choice.ranked[0], choice.reason) == (home("k1", REPLICAS), "home")


@given(st.lists(st.text("xyz0123456789", min_size=1, max_size=5), min_size=1, max_size=30, unique=True))
def test_a_replica_leaving_moves_only_the_keys_homed_on_it(keys):
    before = {k: home(k, REPLICAS) for k in keys}
    after = {k: home(k, REPLICAS[:-1]) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != REPLICAS[-1])


def test_a_report_replaces_the_belief_and_forget_drops_it():
    policy = AffinityPolicy()
    policy.routed("r1", ["a", "b"])
    policy.report("r1", ["b", "c"])  # generation 1: "a" was routed in generation 0, kept over one report
    assert policy.choose(REPLICAS, ["a"], {}, "t").ranked[0] == "r1"
    policy.report("r1", ["c"])  # "a" and "b" evicted there, as the second report says
    assert policy.believed("r1") == 1
    assert policy.choose(REPLICAS, ["a", "b"], {}, "t").reason == "home"
    policy.forget("r1")
    assert policy.believed("r1") == 0
    assert policy.choose([r for r in REPLICAS if r != "r1"], ["c"], {}, "t").reason == "home"


def test_routed_keys_are_capped_oldest_first():
    policy = AffinityPolicy(routed_cap=3)
    policy.routed("r0", ["a", "b", "c"])
    policy.routed("r0", ["d"])
    assert list(policy.beliefs["r0"].routed) == ["b", "c", "d"]


def test_baselines_and_bad_arguments():
    rr = RoundRobinPolicy()
    assert [rr.choose(["b", "a"], ["k"], {}, "t").ranked[0] for _ in range(3)] == ["a", "b", "a"]
    a, b = RandomPolicy(seed=3), RandomPolicy(seed=3)
    assert [a.choose(REPLICAS, [], {}, "t").ranked for _ in range(4)] == [
        b.choose(REPLICAS, [], {}, "t").ranked for _ in range(4)
    ]
    assert isinstance(make_policy("round_robin"), RoundRobinPolicy)
    with pytest.raises(ValueError, match="unknown routing policy 'nearest'"):
        make_policy("nearest")
    with pytest.raises(ValueError, match="epsilon must be a number > 0"):
        AffinityPolicy(epsilon=0)
    for policy in (AffinityPolicy(), rr, a):
        with pytest.raises(ValueError, match="no replicas"):
            policy.choose([], ["k"], {}, "t")
