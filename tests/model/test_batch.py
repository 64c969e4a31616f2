"""A continuous batch's decode step (``HybridModel.decode_batch``): every row equals the same request alone."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.model import load_model
from hypic_rag.testing.parity import rounding_bound

# Gated DeltaNet, Mamba2 (Nemotron-H), Mamba2 with MoE (Granite-4.0-H), an MoE with Gated DeltaNet, KDA + MLA,
# and Zamba2's shared blocks, which read each row's token embeddings.
KINDS = ["qwen3_5_text", "nemotron_h", "granitemoehybrid", "qwen3_5_moe_text", "kimi_linear", "zamba2"]
STEPS = 5


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=gen) for n in lengths]


def _alone(model, prompt, steps):
    """Greedy tokens and the logits after each, one request on its own."""
    state = model.new_state()
    logits = model(prompt[None], state=state)[0, -1]
    tokens, seen = [], [logits]
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = model(torch.tensor([[tokens[-1]]]), state=state)[0, -1]
        seen.append(logits)
    return tokens, seen


@pytest.mark.parametrize("kind", KINDS)
@torch.inference_mode()
def test_rows_that_join_and_leave_equal_each_request_alone(kind, checkpoint):
    model = load_model(checkpoint(kind))
    prompts = _prompts([5, 17, 11, 8])
    bound = max(1e-4, rounding_bound(model, prompts[1][None]))
    expected = [_alone(model, p, STEPS) for p in prompts]
    # Rows 0-2 start together; row 3 joins at step 2; row 1 leaves after three steps.
    joins, leaves = {0: 0, 1: 0, 2: 0, 3: 2}, {1: 3}
    states, logits, tokens = {}, {}, {i: [] for i in range(len(prompts))}
    for step in range(STEPS + 2):
        for i, at in joins.items():
            if at == step:
                states[i] = model.new_state()
                logits[i] = model(prompts[i][None], state=states[i])[0, -1]
        rows = [i for i in states if len(tokens[i]) < STEPS and leaves.get(i, STEPS + 9) > step]
        if not rows:
            break
        for i in rows:
            tokens[i].append(int(logits[i].argmax()))
        out = model.decode_batch([tokens[i][-1] for i in rows], [states[i] for i in rows])
        for row, i in enumerate(rows):
            logits[i] = out[row]
            want = expected[i][1][len(tokens[i])]
            assert float((out[row] - want).abs().max()) < bound, (kind, i, step)
    for i, (want, _) in enumerate(expected):
        got = tokens[i]
        assert got == want[: len(got)], (kind, i)
        assert len(got) == (3 if i == 1 else STEPS)


@torch.inference_mode()
def test_an_unchanged_batch_steps_its_linear_state_in_place(checkpoint):
    """While the same rows step in the same order, each linear layer's state stays in the one stack the first
    step made (no copy a token); reordered rows are stacked afresh; every row still equals its request alone."""
    model = load_model(checkpoint("qwen3_5_text"))
    prompts = _prompts([6, 9])
    bound = max(1e-4, rounding_bound(model, prompts[1][None]))
    expected = [_alone(model, p, 4)[1] for p in prompts]
    states = [model.new_state() for _ in prompts]
    tokens = [int(model(p[None], state=s)[0, -1].argmax()) for p, s in zip(prompts, states, strict=True)]
    layer = states[0].linear_layer_ids[0]
    where = []
    for step, order in enumerate(([0, 1], [0, 1], [1, 0], [1, 0])):
        out = model.decode_batch([tokens[i] for i in order], [states[i] for i in order])
        for row, i in enumerate(order):
            assert float((out[row] - expected[i][step + 1]).abs().max()) < bound, (step, i)
            tokens[i] = int(out[row].argmax())
        where.append([states[i].linear(layer).recurrent.data_ptr() for i in order])
    assert where[1] == where[0] and where[3] == where[2] and where[2] != where[1][::-1]


@torch.inference_mode()
def test_a_batch_step_never_writes_state_it_was_handed(checkpoint):
    """States placed from elsewhere (a cache's tensors, here rows of one stack as a batched prefill leaves them)
    are read, not written, even when they sit as a batch's rows would."""
    model = load_model(checkpoint("qwen3_5_text"))
    prompts = _prompts([7, 7])
    prefilled = model.new_state()
    model(torch.stack(prompts), state=prefilled)
    before = {i: prefilled.linear(i).recurrent.clone() for i in prefilled.linear_layer_ids}
    states = [model.new_state() for _ in prompts]
    for row, state in enumerate(states):
        state.extend(
            len(prompts[row]),
            {
                i: (prefilled.linear(i).conv[row : row + 1], prefilled.linear(i).recurrent[row : row + 1])
                for i in before
            },
            {
                i: (kv.keys[row : row + 1], kv.values[row : row + 1])
                for i in prefilled.attention_layer_ids
                if (kv := prefilled.attention(i))
            },
            shift=0,
        )
    model.decode_batch([5, 6], states)
    for i, kept in before.items():
        assert torch.equal(prefilled.linear(i).recurrent, kept), i
        assert not torch.equal(states[0].linear(i).recurrent[0], kept[0]), i


@torch.inference_mode()
def test_a_batch_step_checks_its_rows(checkpoint):
    model = load_model(checkpoint("qwen3_5_text"))
    state = model.new_state()
    model(_prompts([4])[0][None], state=state)
    with pytest.raises(ValueError, match="2 tokens for 1 request states"):
        model.decode_batch([1, 2], [state])
    with pytest.raises(ValueError, match="prefilled state"):
        model.decode_batch([1, 2], [state, model.new_state()])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.decode_batch([model.config.vocab_size], [state])
    with pytest.raises(ValueError, match="at least one"):
        model.decode_batch([], [])
