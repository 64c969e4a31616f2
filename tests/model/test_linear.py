"""The packed and decode-batch layouts of ``model/linear.py`` compute the same products as ``nn.Linear``."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from hypic_rag.model.linear import Linear, LMHead


def _head(vocab: int = 1000, hidden: int = 64) -> LMHead:
    head = LMHead(hidden, vocab)
    torch.nn.init.normal_(head.weight, std=0.05)
    return head


@torch.inference_mode()
def test_head_matches_the_plain_product_and_a_row_alone_equals_it_in_a_batch():
    head = _head()
    h = torch.randn(8, 64)
    out = head(h)
    torch.testing.assert_close(out, F.linear(h, head.weight), rtol=0, atol=1e-5)
    for i in range(8):
        assert torch.equal(head(h[i : i + 1]), out[i : i + 1]) or torch.allclose(
            head(h[i : i + 1]), out[i : i + 1], atol=1e-6
        )
    assert head(torch.randn(2, 3, 64)).shape == (2, 3, 1000)


def test_head_repacks_when_its_weight_changes():
    head = _head()  # a loaded model's weights are ordinary tensors, written in place under no_grad
    h = torch.randn(4, 64)
    with torch.inference_mode():
        before = head(h)
    with torch.no_grad():
        head.weight.mul_(2.0)
    with torch.inference_mode():
        torch.testing.assert_close(head(h), 2 * before, rtol=1e-5, atol=1e-5)
        head.weight = torch.nn.Parameter(torch.ones(1000, 64), requires_grad=False)
        torch.testing.assert_close(head(h), h.sum(-1, keepdim=True).expand(4, 1000), rtol=1e-5, atol=1e-5)


def test_head_falls_back_off_cpu_fp32_and_under_autograd():
    head = _head()
    assert head.packed_weight(torch.randn(1, 64)) is None  # autograd on: the weight requires grad
    with torch.inference_mode():
        assert head.packed_weight(torch.randn(1, 64, dtype=torch.float64)) is None
        head.pack = False
        assert head.packed_weight(torch.randn(1, 64)) is None
    h = torch.randn(3, 64, requires_grad=True)
    head(h).sum().backward()  # the plain product keeps gradients
    assert h.grad is not None and head.weight.grad is not None


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 64, 65])
@torch.inference_mode()
def test_linear_decode_rows_match_f_linear(rows: int, bias: bool, pack: bool):
    layer = Linear(48, 96, bias=bias)
    layer.pack = pack
    x = torch.randn(rows, 1, 48)
    out = layer(x)
    assert out.shape == (rows, 1, 96)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)
    torch.testing.assert_close(layer(x.reshape(1, rows, 48))[0], out[:, 0], rtol=0, atol=1e-5)


@torch.inference_mode()
def test_a_copied_head_repacks_its_own_weight():
    import copy

    head = _head()
    h = torch.randn(2, 64)
    out = head(h)
    head.int8 = True
    twin = copy.deepcopy(head)
    torch.testing.assert_close(twin(h), out, rtol=0, atol=0)
    assert twin.packed_weight(h) is not head.packed_weight(h)
    assert twin.int8  # an 8-bit copy is rebuilt for the twin's own weight, not shared


def test_head_drops_its_copy_when_the_weight_is_cast_loaded_or_packing_turned_off():
    head = _head()
    h = torch.randn(3, 64)
    with torch.inference_mode():
        head(h)
    assert head._packed.held
    head.to(torch.bfloat16).to(torch.float32)  # the weight now holds bf16-rounded values
    with torch.inference_mode():
        torch.testing.assert_close(head(h), F.linear(h, head.weight), rtol=0, atol=1e-5)
    head.load_state_dict({"weight": torch.full((1000, 64), 0.5)})
    with torch.inference_mode():
        torch.testing.assert_close(head(h), F.linear(h, head.weight), rtol=0, atol=1e-5)
        head.pack = False
        assert not head._packed.held and head.packed_weight(h) is None
        head.pack = True
        head(h)
        assert head._packed.held
        head.invalidate()
        assert not head._packed.held


@torch.inference_mode()
def test_a_packed_projection_gives_a_row_the_same_output_alone_and_in_a_batch():
    layer = Linear(64, 160, bias=True)
    x = torch.randn(8, 1, 64)
    out = layer(x)
    assert layer._packed.held
    for i in range(8):
        torch.testing.assert_close(layer(x[i : i + 1]), out[i : i + 1], rtol=0, atol=1e-6)
    for width in (2, 3, 4):  # up to four rows run as four: a row alone is bit for bit the same
        few = layer(x[:width])
        assert all(torch.equal(layer(x[i : i + 1]), few[i : i + 1]) for i in range(width))
    prompt = torch.randn(1, 37, 64)  # a prompt's rows run on the same packed weight
    torch.testing.assert_close(layer(prompt), F.linear(prompt, layer.weight, layer.bias), rtol=0, atol=1e-5)


def test_engine_loads_without_packed_projections_when_asked():
    from hypic_rag import Engine
    from hypic_rag.model.linear import Linear as Projection

    engine = Engine.from_pretrained(pack_weights=False)
    layers = [m for m in engine.model.modules() if isinstance(m, Projection) and m is not engine.model.lm_head]
    assert layers and not any(m.pack for m in layers) and engine.model.lm_head.pack
    packed = Engine.from_pretrained()
    assert engine.generate([], "Hi", max_new_tokens=4).text == packed.generate([], "Hi", max_new_tokens=4).text
    assert not any(m._packed.held for m in layers)
    assert any(m._packed.held for m in packed.model.modules() if isinstance(m, Projection))


def test_engine_loads_without_a_packed_head_when_asked():
    from hypic_rag import Engine

    engine = Engine.from_pretrained(pack_head=False)
    assert engine.model.lm_head.pack is False
    packed = Engine.from_pretrained()
    assert engine.generate([], "Hi", max_new_tokens=4).text == packed.generate([], "Hi", max_new_tokens=4).text
    assert not engine.model.lm_head._packed.held


@torch.inference_mode()
def test_decode_steps_read_the_8_bit_copy_close_to_the_float_product_and_prompts_the_float_weight():
    from hypic_rag.model.linear import decoding

    torch.manual_seed(0)
    layer = Linear(256, 384, bias=True)
    x = torch.randn(6, 1, 256)
    exact = F.linear(x, layer.weight, layer.bias)
    layer.int8 = True
    torch.testing.assert_close(layer(x), exact, rtol=0, atol=1e-5)  # outside a decode step: the float weight
    with decoding():
        got = layer(x)
        assert not torch.allclose(got, exact, rtol=0, atol=1e-6)  # it did read the 8-bit copy
        assert float((got - exact).norm() / exact.norm()) < 0.03  # 8-bit activations (7-bit range) and weights
        # one range for every row (module docstring): a row alone is bit for bit the same as in any batch
        assert all(torch.equal(layer(x[i : i + 1]), got[i : i + 1]) for i in range(6))
        assert torch.equal(layer(x[1:4]), got[1:4])
        layer.weight = torch.nn.Parameter(layer.weight * 2)  # a new weight: a new copy
        assert float((layer(x) - 2 * exact + layer.bias).norm() / (2 * exact - layer.bias).norm()) < 0.03
    layer.int8 = False
    with decoding():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)


def test_an_int8_engine_decodes_a_row_alone_as_in_a_batch_and_keys_its_cache_apart():
    from hypic_rag import Engine

    engine = Engine.from_pretrained(weights="int8")
    assert engine.model.decodes_int8 and engine.fingerprint != Engine.from_pretrained().fingerprint
    asks = [[{"role": "user", "content": q}] for q in ("Where does Bo Ek live?", "Hi", "What is Ana's job?")]
    batched = engine.chat_batch(asks, max_new_tokens=12, mode="full")
    alone = [engine.chat(ask, max_new_tokens=12, mode="full") for ask in asks]
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]
    for weights, device, dtype in (("int4", "cpu", "float32"), ("int8", "cpu", "bfloat16")):
        with pytest.raises(ValueError, match="weights"):
            Engine.from_pretrained(weights=weights, device=device, dtype=dtype)


@torch.inference_mode()
def test_a_row_that_is_not_finite_spoils_only_itself_under_8_bit_weights():
    from hypic_rag.model.linear import decoding

    layer = Linear(64, 32, bias=True)
    layer.int8 = True
    x = torch.randn(5, 64)
    x[0, 3] = float("nan")
    with decoding():
        out = layer(x)
        assert torch.isnan(out[0]).all() and torch.equal(out[1:], torch.cat([layer(x[i : i + 1]) for i in range(1, 5)]))


@torch.inference_mode()
def test_decode_steps_read_the_bfloat16_copy_close_to_the_float_product_and_a_row_alone_as_in_a_batch():
    from hypic_rag.model.linear import decoding

    torch.manual_seed(0)
    layer = Linear(256, 384, bias=True)
    x = torch.randn(4, 1, 256)
    exact = F.linear(x, layer.weight, layer.bias)
    layer.bf16 = True
    torch.testing.assert_close(layer(x), exact, rtol=0, atol=1e-5)  # outside a decode step: the float weight
    with decoding():
        got = layer(x)
    if not layer._bf16.held:  # a torch build without oneDNN's bfloat16 product: the float weight, as said
        torch.testing.assert_close(got, exact, rtol=0, atol=1e-5)
        return
    reference = F.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()).float()
    assert not torch.allclose(got, exact, rtol=0, atol=1e-6)  # it did read the bfloat16 copy
    assert float((got - exact).norm() / exact.norm()) < 0.01
    assert float((got - reference).norm() / reference.norm()) < 0.01
    with decoding():  # up to four rows run as four: a row alone is bit for bit the same
        assert all(torch.equal(layer(x[i : i + 1]), got[i : i + 1]) for i in range(4))
        layer.bf16 = False
        assert not layer._bf16.held
        torch.testing.assert_close(layer(x), exact, rtol=0, atol=1e-5)


def test_a_bfloat16_engine_decodes_where_the_cpu_multiplies_bfloat16_and_float32_elsewhere(monkeypatch):
    from hypic_rag import Engine
    from hypic_rag import engine as engine_module

    monkeypatch.setattr(engine_module, "native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="no native bfloat16"):
        plain = Engine.from_pretrained(weights="bfloat16")
    assert not plain.model.decodes_bf16 and plain.fingerprint == Engine.from_pretrained().fingerprint
    monkeypatch.setattr(engine_module, "native_bf16", lambda: True)
    engine = Engine.from_pretrained(weights="bfloat16")
    assert engine.model.decodes_bf16 and engine.fingerprint != plain.fingerprint
    asks = [[{"role": "user", "content": q}] for q in ("Where does Bo Ek live?", "Hi", "What is Ana's job?")]
    batched = engine.chat_batch(asks, max_new_tokens=12, mode="full")
    alone = [engine.chat(ask, max_new_tokens=12, mode="full") for ask in asks]
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]
    with pytest.raises(ValueError, match="weights"):
        Engine.from_pretrained(weights="bfloat16", dtype="bfloat16")
