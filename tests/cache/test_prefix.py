"""Kept states: found by the longest run of tokens a prompt begins with, in the namespaces a request may read,
only with their whole chain; restored, they continue as the state they were."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine
from hypic_rag.assembly import run_in_context
from hypic_rag.cache.lru import ByteLRU
from hypic_rag.cache.prefix import EXACT, PrefixStore, composed_namespace

IDS = torch.randint(3, 320, (60,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return Engine.from_pretrained(checkpoint("qwen3_5_text"))


def _run(engine: Engine, ids, state=None):
    state = state if state is not None else engine.model.new_state()
    with torch.inference_mode():
        run_in_context(engine.model, state, ids)
    return state


def _logits(engine: Engine, state, ids) -> torch.Tensor:
    with torch.inference_mode():
        return engine.prefill_program.last_logits(ids, state)


def _kept(store: PrefixStore, engine: Engine, ends, namespaces, base=None):
    """Run ``IDS`` up to each of ``ends`` after ``base``, marking each under its namespace; keep them all."""
    state = engine.model.new_state()
    if base is not None:
        store.restore(base, state)
    keeping = store.begin(state, base)
    for end, namespace in zip(ends, namespaces, strict=True):
        _run(engine, IDS[state.seq_len : end], state)
        store.mark(keeping, IDS[:end], state, namespace)
    return store.keep(keeping, state)


def test_the_longest_kept_state_a_prompt_begins_with_is_restored_and_continues_as_it_was(engine):
    store = PrefixStore("f")
    second = _kept(store, engine, [20, 45], [EXACT, EXACT])
    first = store.find(IDS[:44])
    assert second is not None and second.length == 45 and [k for k, _ in second.chain] == [first.key, second.key]
    assert first.length == 20  # a node longer than the prompt's own tokens is not a prefix of it
    other = IDS[:30] + [7] * 20
    assert store.find(other).length == 20  # differs after token 30: the state after 20 still holds
    found = store.find(IDS, most=59)
    assert found.key == second.key
    restored = engine.model.new_state()
    store.restore(found, restored)
    assert restored.seq_len == 45
    want = _logits(engine, _run(engine, IDS[:59]), IDS[59:])
    got = _logits(engine, _run(engine, IDS[45:59], restored), IDS[59:])
    assert float((got - want).abs().max()) < 1e-4
    assert store.find(IDS, most=44).length == 20 and store.find([1, 2, 3]) is None


def test_a_state_is_found_only_in_the_namespaces_asked_and_only_with_its_whole_chain(engine):
    """A point needs its own linear states and every node's KV up its chain; the linear states go first."""
    memory = ByteLRU(1 << 30, policy="lru")
    store = PrefixStore("f", memory)
    composed = composed_namespace(8, "B")
    root = _kept(store, engine, [20], [EXACT])
    leaf = _kept(store, engine, [40], [composed], base=root)
    assert store.find(IDS).length == 20  # exact only: the composed one is not read
    assert store.find(IDS, (EXACT, composed)).key == leaf.key
    assert store.find(IDS, (composed,)).key == leaf.key
    memory.pop("prefix/point:" + root.key, "capacity")  # the root's linear states evicted: its KV still serves
    assert store.find(IDS) is None and store.find(IDS, (EXACT, composed)).key == leaf.key
    memory.pop("prefix/" + root.key, "capacity")  # evicted, as the shared budget may evict any node
    assert store.find(IDS, (EXACT, composed)) is None  # its parent's KV is gone: a leaf alone is never used


def test_a_kept_state_must_hold_the_tokens_it_is_kept_under(engine):
    store = PrefixStore("f")
    state = _run(engine, IDS[:20])
    with pytest.raises(ValueError, match="a state of 20 tokens kept under 19 ids"):
        store.mark(store.begin(engine.model.new_state(), None), IDS[:19], state, EXACT)


def test_a_long_conversation_keeps_its_chain_under_a_budget_its_points_overflow(engine):
    """Under the value policy, points of old turns are evicted, not the first nodes of the chain the newest ones
    stand on: a conversation far longer than its budget still restores its last turn."""
    ids = torch.randint(3, 320, (400,), generator=torch.Generator().manual_seed(1)).tolist()
    state = _run(engine, ids)
    point = sum(s.conv.nbytes + s.recurrent.nbytes for s in map(state.linear, state.linear_layer_ids))
    kv = sum(state.attention(i).nbytes for i in state.attention_layer_ids)
    memory = ByteLRU(kv + 6 * point, policy="value")  # the whole conversation's KV and about six points
    store = PrefixStore("f", memory)
    kept = None
    for end in range(10, 401, 10):
        found = store.find(ids[:end], most=end - 1)
        assert end <= 20 or (found is not None and found.length == end - 10), end  # the last turn's state
        state = engine.model.new_state()
        if found is not None:
            store.restore(found, state)
        keeping = store.begin(state, found)
        _run(engine, ids[state.seq_len : end], state)
        store.mark(keeping, ids[:end], state, EXACT)
        kept = store.keep(keeping, state)
    assert kept is not None and kept.length == 400 and store.stats()["prefix_points"] < 40


def test_a_stretch_of_a_kept_chain_is_found_again_later_in_a_prompt(engine):
    """After an insertion a conversation's later turns are still its nodes' edges in order: a run starts at an
    edge of at least ``RUN_PROBE`` tokens, goes on while the edges match, ends at its last node with a point, and is
    found only where what its states carry (the tokens before it where it was kept) is all before it again, with
    no more inserted than it covers."""
    memory = ByteLRU(1 << 30, policy="lru")
    store = PrefixStore("f", memory)
    _kept(store, engine, [20, 30, 45], [EXACT, EXACT, EXACT])
    moved = IDS[:20] + [7] * 5 + IDS[20:60]  # five tokens inserted after the first node: its children at 25
    run = store.find_run(moved, 25, (EXACT,), len(moved))
    assert (run.start, run.length, run.first) == (25, 25, 20)
    assert [node.seq_len for _, node in run.chain] == [30, 45]
    kv = run.kv()
    assert all(layer.keys.shape[2] == 25 and layer.positions[0] == 20 for layer in kv.values())
    assert store.find_run(moved, 25, (EXACT,), 25 + 24).length == 10  # the next node would pass ``most``
    assert store.find_run(moved, 25, (composed_namespace(8, "B"),), len(moved)) is None
    assert store.find_run(moved, 24, (EXACT,), len(moved)) is None  # no edge begins there
    assert store.find_run([7] * 5 + IDS, 5, (EXACT,), 65) is None  # a chain's start is no run: it carries nothing
    removed = IDS[:10] + IDS[20:60]  # what the run's states carry is no longer all in the prompt
    assert store.find_run(removed, 10, (EXACT,), len(removed)) is None
    longer = IDS[:20] + [7] * 26 + IDS[20:60]  # its states would forget more than it gives
    assert store.find_run(longer, 46, (EXACT,), len(longer)) is None
    changed = [*moved]
    changed[45] = 2  # inside the second edge: the run ends before it
    assert store.find_run(changed, 25, (EXACT,), len(changed)).length == 10
    second = run.chain[-1][0]
    memory.pop("prefix/point:" + second, "capacity")  # the last node's linear states evicted: cut back
    assert store.find_run(moved, 25, (EXACT,), len(moved)).length == 10
    memory.pop("prefix/" + run.chain[0][0], "capacity")  # the first node's KV evicted: no run
    assert store.find_run(moved, 25, (EXACT,), len(moved)) is None
