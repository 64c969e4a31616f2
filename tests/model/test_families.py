"""The family registry: every family is tested, declares what the runtime builds, and nothing else names one."""

from __future__ import annotations

import inspect

import pytest
import torch

from hypic_rag.model import SUPPORTED_MODEL_TYPES, config, load_model, loading, model
from hypic_rag.model.families import FAMILIES, Family, config_from_file, family_of, read_config
from hypic_rag.model.layers import FUSED_GATE_UP, GATE_UP_DOWN, Experts, MoE, Router, SwiGLU
from hypic_rag.testing.synthetic import KINDS, OWN_KINDS


def test_every_family_has_a_test_checkpoint(checkpoint):
    """A family's test entry is a tiny checkpoint kind; one without it would go untested against transformers."""
    covered = {config_from_file(checkpoint(kind)).model_type for kind in (*KINDS, *OWN_KINDS)}
    untested = [f.model_types for f in FAMILIES if not covered & set(f.model_types)]
    assert not untested


def test_supported_model_types_are_the_families():
    declared = [t for f in FAMILIES for t in f.model_types]
    assert sorted(declared) == sorted(SUPPORTED_MODEL_TYPES) and len(set(declared)) == len(declared)
    assert all(family_of(t) in FAMILIES for t in SUPPORTED_MODEL_TYPES)
    for bad in ("llama", None, ["qwen3_next"]):
        with pytest.raises(ValueError, match="unsupported model_type"):
            family_of(bad)


def test_the_generic_modules_name_no_family():
    """config, model and loading ask the registry; a model_type written in them would be a per-family branch."""
    for module in (config, model, loading):
        source = inspect.getsource(module)
        named = [t for t in SUPPORTED_MODEL_TYPES if f'"{t}"' in source or f"'{t}'" in source]
        assert not named, f"{module.__name__} names {named}"


def test_a_family_declaration_is_checked():
    with pytest.raises(ValueError, match="unknown mixer 'mamba3'"):
        Family(model_types=("x",), mixer="mamba3", read_config=lambda cls, data: cls(**data), layer=lambda c, i: None)
    with pytest.raises(ValueError, match="at least one model_type"):
        Family(model_types=(), mixer="mamba2", read_config=lambda cls, data: cls(**data), layer=lambda c, i: None)


@pytest.mark.parametrize("kind", [*KINDS, *OWN_KINDS])
def test_each_family_builds_what_it_declares(checkpoint, kind):
    """The stack sits under the declared names, and a bf16 model keeps exactly the declared parameters fp32."""
    ours = load_model(checkpoint(kind), dtype=torch.bfloat16)
    family = ours.family
    params = dict(ours.named_parameters())
    assert family.embedding_weight in params
    assert f"{family.root}.{family.final_norm}.weight" in params
    assert all(f"{family.root}.layers.{i}." in " ".join(params) for i in range(ours.config.num_hidden_layers))
    for name, p in params.items():
        assert p.dtype == (torch.float32 if name.endswith(family.fp32_params) else torch.bfloat16), name
    assert {i for i, layer in enumerate(ours._stack[1]) if layer.is_linear} == set(ours.linear_mixers())


def test_fused_swiglu_is_the_split_one_gate_first():
    """Granite's ``input_linear`` holds the gate's rows, then the up projection's."""
    torch.manual_seed(0)
    split, fused = SwiGLU(8, 12, names=GATE_UP_DOWN), SwiGLU(8, 12, names=FUSED_GATE_UP)
    with torch.no_grad():
        fused.input_linear.weight.copy_(torch.cat((split.gate_proj.weight, split.up_proj.weight)))
        fused.output_linear.weight.copy_(split.down_proj.weight)
    x = torch.randn(3, 8)
    torch.testing.assert_close(fused(x), split(x), rtol=0, atol=1e-6)
    assert [n for n, _ in fused.named_parameters()] == ["input_linear.weight", "output_linear.weight"]
    with pytest.raises(ValueError, match="SwiGLU names"):
        SwiGLU(8, 12, names={"gate": "w1", "down": "w2"})


def test_moe_router_name_is_only_a_name():
    """Jamba's ``router`` and MiniMax's ``gate``: one MoE, the same output under either name."""
    cfg = read_config({"model_type": "minimax", "num_hidden_layers": 2, "hidden_size": 16,
                                  "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 8,
                                  "num_local_experts": 4})  # fmt: skip
    torch.manual_seed(0)
    gate, router = MoE(Router(cfg), Experts(cfg)), MoE(Router(cfg), Experts(cfg), router_name="router")
    with torch.no_grad():
        for p in gate.parameters():
            p.normal_()
    router.load_state_dict({k.replace("gate.", "router.", 1): v for k, v in gate.state_dict().items()})
    assert "router.weight" in dict(router.named_parameters()) and not hasattr(router, "gate")
    x = torch.randn(2, 5, 16)
    assert torch.equal(gate(x), router(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_block_a_checkpoint_ties_to_several_layers_is_held_once(checkpoint, dtype):
    """Zamba2's third hybrid layer reuses the first one's shared block, which the checkpoint stores once: loaded,
    both layers' parameters share one tensor at any dtype, and the adapters stay each layer's own."""
    model = load_model(checkpoint("zamba2"), dtype=dtype)
    layers = model._stack[1]
    first, third = layers[1].shared_transformer, layers[4].shared_transformer
    assert first.self_attn.q_proj.weight.data_ptr() == third.self_attn.q_proj.weight.data_ptr()
    assert first.feed_forward.down_proj.weight.data_ptr() == third.feed_forward.down_proj.weight.data_ptr()
    assert first.self_attn.q_adapter[0].weight.data_ptr() != third.self_attn.q_adapter[0].weight.data_ptr()
    second = layers[3].shared_transformer  # the other block
    assert second.self_attn.q_proj.weight.data_ptr() != first.self_attn.q_proj.weight.data_ptr()
