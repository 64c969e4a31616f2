"""Reading ``config.json`` for every supported model type, and rejecting what we cannot run."""

from __future__ import annotations

import json

import pytest

from hypic_rag.model.families import config_from_file, family_of, read_config
from hypic_rag.testing.synthetic import KINDS, TINY, TINY_NEMOTRON_H

GDN_KINDS = [k for k in KINDS if k.startswith("qwen")]


@pytest.mark.parametrize("kind", GDN_KINDS)
def test_saved_configs_read_back(checkpoint, kind):
    cfg = config_from_file(checkpoint(kind))
    assert cfg.layer_types == tuple(TINY["layer_types"])
    assert (cfg.hidden_size, cfg.head_dim, cfg.rotary_dim) == (64, 16, 4)
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)
    assert cfg.num_experts == (4 if "moe" in kind else 0)
    if kind == "qwen3_next_moe":
        assert not cfg.norm_topk_prob and not cfg.is_moe_layer(1) and cfg.is_moe_layer(0)


def test_qwen3_5_wrapper_reads_text_config():
    cfg = read_config(
        {
            "model_type": "qwen3_5",
            "tie_word_embeddings": True,
            "eos_token_id": 7,
            "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 8, "hidden_size": 128},
        }
    )
    assert cfg.model_type == "qwen3_5_text" and cfg.tie_word_embeddings and cfg.eos_token_ids == (7,)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",
    )


def test_qwen3_5_moe_wrapper():
    cfg = read_config({"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 4}})
    assert cfg.num_experts == 256 and cfg.norm_topk_prob and all(cfg.is_moe_layer(i) for i in range(4))


@pytest.mark.parametrize(
    "data,message",
    [
        ({"model_type": "llama"}, "unsupported model_type 'llama'"),
        ({}, "unsupported model_type None"),
        ({"model_type": "qwen3_5"}, "needs a 'text_config'"),
        ({"model_type": "qwen3_next", "num_hidden_layers": 2, "layer_types": ["linear_attention"]}, "layer_types"),
        ({"model_type": "qwen3_5_text", "rope_parameters": {"rope_type": "yarn"}}, "unsupported rope_type 'yarn'"),
        ({"model_type": "qwen3_5_text", "num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ],
)
def test_bad_configs_are_refused(data, message):
    with pytest.raises(ValueError, match=message):
        read_config(data)


def test_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        config_from_file(tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        config_from_file(tmp_path / "nowhere")


def test_unsupported_model_type_in_a_checkpoint(checkpoint, tmp_path):
    import shutil

    from hypic_rag import Engine

    path = tmp_path / "ck"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, "model_type": "mamba2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'mamba2'"):
        Engine.from_pretrained(path)


@pytest.mark.parametrize("kind", ["nemotron_h", "nemotron_h_moe"])
def test_saved_nemotron_h_configs_read_back(checkpoint, kind):
    cfg = config_from_file(checkpoint(kind))
    assert family_of(cfg.model_type).mixer == "mamba2" and cfg.rotary_dim == 0  # no position encoding in its attention
    assert cfg.layer_types[:2] == ("linear_attention", "full_attention")
    assert cfg.layer_types[2] == ("moe" if kind.endswith("moe") else "mlp")
    assert (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.mamba_n_groups) == (8, 8, 16, 2)
    assert cfg.mamba_conv_dim == 64 + 2 * 2 * 16
    assert cfg.num_experts == (4 if kind.endswith("moe") else 0)


def _nemotron(**fields) -> dict:
    base = {k: v for k, v in TINY_NEMOTRON_H.items() if k != "layers_block_type"}
    return {"model_type": "nemotron_h", **base, **fields}


def test_nemotron_h_reads_real_checkpoint_spellings():
    """Published configs write ``hybrid_override_pattern`` and the ``mamba_*`` aliases; older ones the
    legacy layer names ``mamba``/``attention``."""
    cfg = read_config(_nemotron(hybrid_override_pattern="M-M*-E", mamba_n_groups=4, mamba_d_conv=3,
                                           n_routed_experts=4, num_experts_per_tok=2, n_group=1))  # fmt: skip
    assert cfg.layer_types == ("linear_attention", "mlp", "linear_attention", "full_attention", "mlp", "moe")
    assert (cfg.mamba_n_groups, cfg.mamba_conv_kernel, cfg.num_hidden_layers) == (4, 3, 6)
    legacy = read_config(_nemotron(layers_block_type=["mamba", "attention", "mlp"]))
    assert legacy.layer_types == ("linear_attention", "full_attention", "mlp")


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"hybrid_override_pattern": "M*X"}, "unknown layer codes"),
        ({}, "needs layers_block_type or hybrid_override_pattern"),
        ({"layers_block_type": ["linear_attention", "sliding_attention"]}, "unsupported layer types"),
        ({"hybrid_override_pattern": "M*", "mlp_hidden_act": "gelu"}, "mlp_hidden_act"),
        ({"hybrid_override_pattern": "M*", "mamba_num_heads": 6, "n_groups": 4}, "multiple of n_groups"),
        ({"hybrid_override_pattern": "M*", "ssm_state_size": 0}, "ssm_state_size must be >= 1"),
    ],
)
def test_nemotron_h_config_errors(fields, match):
    with pytest.raises(ValueError, match=match):
        read_config(_nemotron(**fields))


@pytest.mark.parametrize("kind", ["granitemoehybrid", "bamba"])
def test_saved_granite_and_bamba_configs_read_back(checkpoint, kind):
    cfg = config_from_file(checkpoint(kind))
    assert family_of(cfg.model_type).mixer == "mamba2"
    assert cfg.layer_types == ("linear_attention", "full_attention") * 2
    assert (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size) == (8, 16, 16)
    assert cfg.time_step_limit == (0.0, float("inf"))  # written as {"__float__": "Infinity"}
    if kind == "granitemoehybrid":
        assert cfg.rotary_dim == 16 and cfg.num_experts == 4 and cfg.attention_scale == 0.2
        assert (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scaling) == (2.0, 0.5, 1.5)
    else:
        assert cfg.rotary_dim == 8 and cfg.num_experts == 0  # Bamba rotates half of each head


def test_granite_reads_published_spellings():
    """Granite-4.0-H's own config.json: legacy layer names, ``mamba_d_head: "auto"``, ``Infinity``, no RoPE."""
    text = (
        '{"model_type": "granitemoehybrid", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,'
        ' "num_hidden_layers": 3,'
        ' "layer_types": ["mamba", "mamba", "attention"], "mamba_n_heads": 8, "mamba_d_head": "auto",'
        ' "mamba_d_state": 16, "time_step_limit": [0.0, Infinity], "position_embedding_type": "nope",'
        ' "num_local_experts": 0, "shared_intermediate_size": 32}'
    )
    cfg = read_config(json.loads(text))
    assert cfg.layer_types == ("linear_attention", "linear_attention", "full_attention")
    assert cfg.mamba_head_dim == 16 and cfg.rotary_dim == 0 and cfg.num_experts == 0
    assert cfg.time_step_limit == (0.0, float("inf"))


@pytest.mark.parametrize(
    "data,match",
    [
        ({"model_type": "bamba", "num_hidden_layers": 2, "attn_layer_indices": [5]}, "attn_layer_indices"),
        ({"model_type": "granitemoehybrid", "layer_types": ["mamba", "conv"]}, "unsupported layer types"),
        ({"model_type": "granitemoehybrid", "hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_granite_and_bamba_config_errors(data, match):
    with pytest.raises(ValueError, match=match):
        read_config(data)


def test_lfm2_reads_published_spellings(checkpoint):
    saved = config_from_file(checkpoint("lfm2"))
    assert family_of(saved.model_type).mixer == "short_conv" and saved.short_conv_kernel == 3 and saved.short_conv_bias
    assert saved.layer_types == ("linear_attention", "full_attention") * 2 and saved.rotary_dim == 16
    # 144 -> int(2 * 144 / 3) = 96 -> * 1.25 = 120 -> rounded up to a multiple of 16 = 128
    assert saved.intermediate_size == 128
    cfg = read_config(
        {"model_type": "lfm2", "num_hidden_layers": 3, "full_attn_idxs": [2], "tie_embedding": False,
         "block_ff_dim": 96, "block_ffn_dim_multiplier": None, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2}
    )  # fmt: skip
    assert cfg.layer_types == ("linear_attention", "linear_attention", "full_attention")
    assert not cfg.tie_word_embeddings and cfg.intermediate_size == 64  # no multiplier: no rounding
    every = read_config({"model_type": "lfm2", "num_hidden_layers": 2, "full_attn_idxs": None})
    assert every.layer_types == ("full_attention", "full_attention")
    with pytest.raises(ValueError, match="'conv' or 'full_attention'"):
        read_config({"model_type": "lfm2", "num_hidden_layers": 1, "layer_types": ["mamba"]})


def test_minimax_reads_release_and_saved_spellings(checkpoint):
    saved = config_from_file(checkpoint("minimax"))
    assert family_of(saved.model_type).mixer == "lightning" and saved.num_experts == 4 and saved.rotary_dim == 16
    assert saved.residual_factors == {"full_attn": (0.9, 1.1), "linear_attn": (1.2, 0.8), "mlp": (0.7, 1.3)}
    release = read_config(
        {"model_type": "minimax", "num_hidden_layers": 3, "attn_type_list": [0, 0, 1], "postnorm": True,
         "layernorm_linear_attention_alpha": 2.0, "layernorm_mlp_beta": 0.5}
    )  # fmt: skip
    assert release.layer_types == ("linear_attention", "linear_attention", "full_attention")
    assert release.residual_factors["linear_attn"] == (2.0, 1.0) and release.residual_factors["mlp"] == (1.0, 0.5)
    with pytest.raises(ValueError, match="postnorm"):
        read_config({"model_type": "minimax", "num_hidden_layers": 2, "postnorm": False})


def test_kimi_linear_reads_its_checkpoint_names(checkpoint):
    saved = config_from_file(checkpoint("kimi_linear"))
    assert family_of(saved.model_type).mixer == "kda"
    assert saved.layer_types == ("linear_attention", "full_attention") * 2
    assert (saved.linear_num_value_heads, saved.linear_value_head_dim, saved.head_dim) == (2, 16, 12)
    assert saved.mlp_only_layers == (0,) and saved.rotary_dim == 0 and saved.num_key_value_heads == 4
    cfg = read_config(
        {"model_type": "kimi_linear", "num_hidden_layers": 3, "num_experts": 4, "num_experts_per_token": 2,
         "num_shared_experts": 2, "moe_intermediate_size": 8, "moe_renormalize": False, "num_expert_group": 2,
         "linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [3], "num_heads": 2, "head_dim": 8}}
    )  # fmt: skip
    assert cfg.layer_types == ("linear_attention", "linear_attention", "full_attention")
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_n_group, cfg.norm_topk_prob) == (4, 2, 2, False)
    assert cfg.shared_expert_intermediate_size == 16 and cfg.linear_key_head_dim == 8
    with pytest.raises(ValueError, match="outside layers"):
        read_config({"model_type": "kimi_linear", "num_hidden_layers": 2,
                                "linear_attn_config": {"kda_layers": [0], "full_attn_layers": [2]}})  # fmt: skip


def test_olmo_hybrid_reads_nope_and_defaults(checkpoint):
    saved = config_from_file(checkpoint("olmo_hybrid"))
    assert family_of(saved.model_type).mixer == "gated_deltanet"
    assert saved.linear_beta_scale == 2.0 and saved.linear_norm_eps == 1e-5
    assert saved.rotary_dim == 16  # no rope_theta written: RoPE with transformers' default theta
    nope = read_config({"model_type": "olmo_hybrid", "num_hidden_layers": 2, "hidden_size": 64,
                                   "num_attention_heads": 4, "rope_theta": None})  # fmt: skip
    assert nope.rotary_dim == 0 and nope.layer_types == ("linear_attention", "full_attention")
    assert (nope.linear_key_head_dim, nope.linear_value_head_dim) == (12, 24)  # int(0.75 * 64 / 4), 2 * dk
    off = read_config({"model_type": "olmo_hybrid", "num_hidden_layers": 4, "hidden_size": 64,
                                  "num_attention_heads": 4, "linear_allow_neg_eigval": False})  # fmt: skip
    assert off.linear_beta_scale == 1.0 and off.layer_types[3] == "full_attention"


def test_falcon_h1_reads_its_multipliers(checkpoint):
    cfg = config_from_file(checkpoint("falcon_h1"))
    assert cfg.layer_types == ("hybrid",) * 3 and cfg.mamba_norm == "norm_then_gate" and cfg.mamba_out_bias
    assert (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.head_dim) == (8, 12, 12)
    assert cfg.embedding_multiplier == 2.0 and cfg.logits_scaling == 2.0  # lm_head_multiplier 0.5
    with pytest.raises(ValueError, match="must equal mamba_d_ssm"):
        read_config({"model_type": "falcon_h1", "mamba_d_ssm": 100, "mamba_n_heads": 8, "mamba_d_head": 12})


def test_jamba_reads_its_periods(checkpoint):
    cfg = config_from_file(checkpoint("jamba"))
    assert family_of(cfg.model_type).mixer == "mamba1" and cfg.layer_types == ("linear_attention", "full_attention") * 2
    assert cfg.mlp_only_layers == (1, 3) and cfg.num_experts == 4 and not cfg.norm_topk_prob
    assert (cfg.mamba1_inner, cfg.mamba_dt_rank, cfg.rotary_dim) == (128, 8, 0)
    auto = read_config({"model_type": "jamba", "num_hidden_layers": 2, "hidden_size": 64,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_period": 2,
                                   "attn_layer_offset": 1, "num_experts": 1})  # fmt: skip
    assert auto.mamba_dt_rank == 4 and auto.num_experts == 0  # ceil(64 / 16); one expert is a plain MLP
    with pytest.raises(ValueError, match="attn_layer_offset"):
        read_config({"model_type": "jamba", "attn_layer_period": 2, "attn_layer_offset": 2})


@pytest.mark.parametrize(
    "data",
    [
        {"model_type": "granitemoehybrid", "num_attention_heads": 0},
        {"model_type": "bamba", "num_attention_heads": 0},
        {"model_type": "lfm2", "num_attention_heads": 0},
        {"model_type": "jamba", "num_attention_heads": 0},
        {"model_type": "falcon_h1", "hidden_size": 0},
        {"model_type": "bailing_moe_linear", "layer_group_size": 0},
        {"model_type": "bailing_moe_linear", "n_group": 0},
        {"model_type": "nemotron_h", "hybrid_override_pattern": "M*E", "num_experts_per_tok": "two"},
        {"model_type": "kimi_linear", "linear_attn_config": {"num_heads": "x"}},
    ],
)
def test_every_family_turns_bad_values_into_a_value_error(data):
    """Zero sizes and fields of the wrong type fail in a reader's arithmetic: a ValueError naming the family."""
    with pytest.raises(ValueError, match=data["model_type"]):
        read_config(data)


def test_review_fixes_in_the_readers():
    # Falcon-H1's head width follows d_ssm / heads ("auto"), as transformers' default does.
    assert read_config({"model_type": "falcon_h1", "mamba_n_heads": 64}).mamba_head_dim == 16
    # Granite: no kv-head count means one per attention head; an explicit head_dim is kept.
    granite = read_config({"model_type": "granitemoehybrid", "num_attention_heads": 8, "head_dim": 64})
    assert granite.num_key_value_heads == 8 and granite.head_dim == 64
    assert read_config({"model_type": "bamba", "num_key_value_heads": None}).num_key_value_heads == 32
    # Nemotron-H: JSON nulls mean the default, as in the other readers.
    nemotron = read_config({"model_type": "nemotron_h", "hybrid_override_pattern": "M*", "time_step_limit": None})
    assert nemotron.time_step_limit == (0.0, float("inf"))
    with pytest.raises(ValueError, match="norm_head"):
        read_config({"model_type": "bailing_moe_linear", "num_hidden_layers": 2, "norm_head": True})


def test_ling_reads_release_and_saved_head_widths(checkpoint):
    saved = config_from_file(checkpoint("bailing_hybrid"))  # transformers writes head_dim = rope width
    assert saved.linear_value_head_dim == 16 and saved.rotary_dim == 8 and saved.head_dim == 16  # 8 nope + 8 rope
    assert saved.kda_safe_gate and saved.kda_lower_bound == -1.0 and saved.mlp_only_layers == (0,)
    release = read_config(
        {"model_type": "bailing_hybrid", "num_hidden_layers": 6, "head_dim": 128, "num_experts": 8, "n_group": 2,
         "topk_group": 1, "layer_group_size": 3, "num_attention_heads": 4}
    )  # fmt: skip
    assert release.linear_value_head_dim == 128 and release.layer_types[2] == "full_attention"
    with pytest.raises(ValueError, match="rope_type"):
        read_config({"model_type": "bailing_hybrid", "rope_parameters": {"rope_type": "yarn"}})


def test_the_dt_clamp_is_read_as_each_family_reads_it():
    """Nemotron-H, Granite, Bamba and Falcon-H1 clamp dt to ``time_step_limit`` (Nemotron-H also under its release
    name ``mamba_dt_limit``); Zamba2 to ``time_step_min`` and up."""
    nemotron = {"model_type": "nemotron_h", "hybrid_override_pattern": "M*", "time_step_min": 0.01}
    assert read_config(nemotron).time_step_limit == (0.0, float("inf"))  # time_step_min is not a clamp
    assert read_config({**nemotron, "mamba_dt_limit": [0.001, 0.1]}).time_step_limit == (0.001, 0.1)
    infinity = {"__float__": "Infinity"}
    for model_type in ("granitemoehybrid", "bamba", "falcon_h1"):
        cfg = read_config({"model_type": model_type, "time_step_limit": [0.002, infinity]})
        assert cfg.time_step_limit == (0.002, float("inf"))
    assert read_config({"model_type": "zamba2", "time_step_min": 0.01}).time_step_limit == (0.01, float("inf"))
    for bad in ([0.1], [0.2, 0.1], [-1.0, 1.0], "0.1"):
        with pytest.raises(ValueError, match="time_step_limit must"):
            read_config({**nemotron, "time_step_limit": bad})
