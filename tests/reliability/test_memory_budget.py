"""One memory budget for all of an engine's in-memory caches, under churn in every mode."""

from __future__ import annotations

from hypic_rag import Segment

from .conftest import QUESTION, engine, same


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _docs(i: int) -> list[Segment]:
    return [Segment(f"Person {i}-{j} lives in town {j} and works as clerk number {i * 7 + j}.") for j in range(3)]


def test_segments_remainders_and_prefix_nodes_share_one_bound(oracle):
    probe = engine()
    probe.generate(_docs(0), QUESTION, max_new_tokens=1, mode="hypic")
    probe.generate(_docs(0), QUESTION, max_new_tokens=1, mode="prefix")
    budget = probe.memory.used * 2  # room for about two requests' entries in all
    churn = engine(memory_bytes=budget)
    for i in range(24):
        mode = ("hypic", "prefix", "pic")[i % 3]
        churn.generate(_docs(i), QUESTION, max_new_tokens=1, mode=mode)
        segments, prefix = churn.segment_store.stats()["memory_bytes"], churn.prefix_store.stats()["prefix_bytes"]
        assert segments + prefix == churn.memory.used <= budget
    pressed = churn.memory.evictions + churn.memory.refused["frequency"]  # one-off documents: refused, not evicting
    assert pressed > 0 and churn.prefix_store.stats()["prefix_nodes"] > 0


def test_rss_stays_bounded_under_churn():
    churn = engine(memory_bytes=4 << 20)
    for i in range(10):  # warm-up: allocator pools, lazily built buffers
        churn.generate(_docs(i), QUESTION, max_new_tokens=2, mode=("hypic", "prefix")[i % 2])
    before = _rss_bytes()
    for i in range(10, 130):
        churn.generate(_docs(i), QUESTION, max_new_tokens=2, mode=("hypic", "prefix")[i % 2])
    assert churn.memory.used <= 4 << 20
    # 120 requests of fresh documents make about 100 MB of entries and prefix nodes; only the budget's 4 stay.
    assert _rss_bytes() - before < 32 << 20


def test_a_tiny_budget_still_answers_exactly(oracle):
    tiny = engine(memory_bytes=0)
    from .conftest import DOCS, segments

    out = tiny.generate(segments(), QUESTION, max_new_tokens=1)
    assert tiny.memory.used == 0 and same(out.prompt_logits, oracle(DOCS))


def test_a_recurring_prefix_is_admitted_under_pressure():
    probe = engine()
    probe.generate(_docs(0), QUESTION, max_new_tokens=1, mode="prefix")
    full = engine(memory_bytes=probe.memory.used)  # room for one request's chain
    full.generate(_docs(0), QUESTION, max_new_tokens=1, mode="prefix")  # kept: there was room
    once = full.generate(_docs(1), QUESTION, max_new_tokens=1, mode="prefix")
    assert once.stats["hit_segments"] == 0 and full.memory.refused["frequency"] > 0  # new: not let in
    full.generate(_docs(1), QUESTION, max_new_tokens=1, mode="prefix")  # it recurs: let in
    again = full.generate(_docs(1), QUESTION, max_new_tokens=1, mode="prefix")
    assert again.stats["hit_segments"] > 0
