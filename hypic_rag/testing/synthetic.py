"""Random-weight checkpoints built with transformers' own model classes.

Tests, the runtime benchmark and the demo need real Hugging Face checkpoints without a model hub,
so they build one: transformers instantiates it, we redraw every weight at a scale that keeps
activations O(1) (so parity checks compare logits of a meaningful size, and conventions such as
RMSNorm's ``1 + w`` matter), and ``save_pretrained`` writes it. Needs ``transformers``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hypic_rag.model.families import read_config

TINY: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    max_position_embeddings=1024,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    eos_token_id=1,
    pad_token_id=0,
)

TINY_MOE: dict[str, Any] = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
)

# The layer shapes of Qwen3.5-0.8B (hidden 1024, Gated DeltaNet 16 x 128 heads, attention 8 q / 2 kv
# heads of 256, FFN 3584, vocabulary 248320, tied embeddings), three linear layers to one full.
QWEN3_5_0_8B_SHAPES: dict[str, Any] = dict(
    vocab_size=248320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=262144,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=True,
)


def hybrid_layer_types(n: int) -> list[str]:
    """Three linear layers to one full, as the published models have, with at least one full."""
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


# Nemotron-H on tiny shapes: Mamba2, attention and ReLU² MLP layers (``_moe``: an MoE layer for the MLP).
TINY_NEMOTRON_H: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention", "mlp", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    mamba_num_heads=8,
    mamba_head_dim=8,
    ssm_state_size=16,
    n_groups=2,
    conv_kernel=4,
    chunk_size=64,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_NEMOTRON_MOE: dict[str, Any] = dict(
    layers_block_type=["linear_attention", "full_attention", "moe", "linear_attention", "mlp", "full_attention"],
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=48,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=1.5,
)

# Granite-4.0-H and Bamba on tiny shapes: Mamba2 and attention layers, each followed by a feed-forward.
TINY_MAMBA_HYBRID: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_d_state=16,
    mamba_n_groups=2,
    mamba_d_conv=4,
    mamba_chunk_size=64,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_GRANITE: dict[str, Any] = dict(
    layer_types=["mamba", "attention", "mamba", "attention"],
    shared_intermediate_size=48,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=32,
    position_embedding_type="rope",
    mamba_proj_bias=True,
    embedding_multiplier=2.0,
    residual_multiplier=0.5,
    attention_multiplier=0.2,
    logits_scaling=1.5,
)

# Zamba2 on tiny shapes: three hybrid layers sharing two blocks (the third reuses the first's), each with its
# own adapters, and rotary attention.
TINY_ZAMBA2: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"],
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=4,  # the adapters write every head's width: transformers' Zamba2 has no GQA with them
    n_mamba_heads=8,
    mamba_d_state=16,
    mamba_ngroups=2,
    mamba_d_conv=4,
    chunk_size=64,
    num_mem_blocks=2,
    use_shared_attention_adapter=True,
    adapter_rank=8,
    use_mem_rope=True,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)

KINDS = (
    "qwen3_next",
    "qwen3_next_moe",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "nemotron_h",
    "nemotron_h_moe",
    "granitemoehybrid",
    "bamba",
    "lfm2",
    "minimax",
    "kimi_linear",
    "olmo_hybrid",
    "falcon_h1",
    "jamba",
    "bailing_hybrid",
    "zamba2",
)
TINY_LING: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    v_head_dim=8,
    qk_nope_head_dim=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    num_local_experts=8,
    head_dim=16,
    layer_group_size=2,
    rope_theta=10000.0,
    # Ling's safe gate at its default bound (-5) with these random weights: fp32 rounding alone (both ours and
    # transformers' about 1e-5 from an fp64 run at the first mixer) reaches 1.7e-4 on the logits, at -2 1e-4
    # (README); at -1 it is 2-4e-5.
    kda_lower_bound=-1.0,
    routed_scaling_factor=1.0,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_JAMBA: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    attn_layer_period=2,
    attn_layer_offset=1,
    expert_layer_period=2,
    expert_layer_offset=0,
    num_experts=4,
    num_experts_per_tok=2,
    mamba_d_state=8,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_dt_rank=8,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_FALCON: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,
    mamba_d_ssm=96,
    mamba_n_heads=8,
    mamba_d_head=12,
    mamba_d_state=16,
    mamba_n_groups=2,
    mamba_d_conv=4,
    mamba_chunk_size=64,
    mamba_rms_norm=True,
    mamba_norm_before_gate=True,
    projectors_bias=True,
    embedding_multiplier=2.0,
    lm_head_multiplier=0.5,
    mlp_multipliers=[0.8, 0.6],
    key_multiplier=0.4,
    attention_in_multiplier=1.3,
    attention_out_multiplier=0.9,
    ssm_in_multiplier=1.25,
    ssm_out_multiplier=0.25,
    ssm_multipliers=[0.35, 0.25, 0.35, 0.5, 0.35],
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_OLMO: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_KIMI: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=2.0,
    linear_attn_config={"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4,
                        "kda_layers": [1, 3], "full_attn_layers": [2, 4]},
    first_k_dense_replace=1,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)  # fmt: skip
TINY_MINIMAX: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    block_size=64,
    max_position_embeddings=1024,
    full_attn_alpha_factor=0.9,
    full_attn_beta_factor=1.1,
    linear_attn_alpha_factor=1.2,
    linear_attn_beta_factor=0.8,
    mlp_alpha_factor=0.7,
    mlp_beta_factor=1.3,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
TINY_LFM2: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=144,
    block_multiple_of=16,
    block_ffn_dim_multiplier=1.25,
    num_hidden_layers=4,
    layer_types=["conv", "full_attention", "conv", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    conv_L_cache=3,
    conv_bias=True,
    max_position_embeddings=1024,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
)
# Norm weights applied as stored (neutral 1) rather than as ``1 + w`` (neutral 0).
_PLAIN_NORMS = ("linear_attn.norm.weight", "norm.weight", "norm_f.weight")
# The families whose every norm weight is applied as stored.
_PLAIN_NORM_FAMILIES = (
    "granitemoehybrid",
    "bamba",
    "lfm2",
    "minimax",
    "kimi_linear",
    "olmo_hybrid",
    "falcon_h1",
    "bailing_moe_linear",
    "jamba",
    "bailing_hybrid",
    "zamba2",
)


# ``small_dt``: every other head's ``dt_bias`` this low, so its softplus(dt) mostly falls below the 0.001 that
# Mamba2 configs give as ``time_step_min`` (whether dt is clamped there is what such a checkpoint tells apart).
SMALL_DT_BIAS = -7.5


def randomize(model: torch.nn.Module, seed: int, small_dt: bool = False) -> None:
    """Redraw every parameter: matrices ~ N(0, 1/fan_in), norm weights near their neutral value, and
    the Gated DeltaNet decay slow enough that states carry information across segments. ``small_dt``:
    half the heads' ``dt_bias`` near ``SMALL_DT_BIAS``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-2.0, 1.0, generator=gen))
            elif name.endswith("dt_bias"):
                # Trained models forget slowly: exp(g) mostly 0.7-0.99 per token, not ~e^-1.
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 - 2.0)
                if small_dt:
                    p[1::2] += SMALL_DT_BIAS + 2.0
            elif p.dim() == 1:
                plain = (
                    name.endswith("linear_attn.norm.weight")
                    or (name.startswith("backbone.") and name.endswith(_PLAIN_NORMS))
                    or (model.config.model_type in _PLAIN_NORM_FAMILIES and "norm" in name)
                )
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if plain else 0.0))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a routing bias: make it matter
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)


@dataclass(frozen=True)
class Reference:
    """How to build one kind's transformers model: its classes (in ``module``) and its config's keywords from the
    caller's overrides (``shapes``: the tiny shapes below, the overrides, then what the kind must keep)."""

    model: str
    config: str
    shapes: Callable[[dict[str, Any]], dict[str, Any]]
    module: str = "transformers"


def _without(params: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in keys}


REFERENCES: dict[str, Reference] = {
    "nemotron_h": Reference("NemotronHForCausalLM", "NemotronHConfig", lambda o: {**TINY_NEMOTRON_H, **o}),
    "nemotron_h_moe": Reference(
        "NemotronHForCausalLM", "NemotronHConfig", lambda o: {**TINY_NEMOTRON_H, **TINY_NEMOTRON_MOE, **o}
    ),
    "granitemoehybrid": Reference(
        "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", lambda o: {**TINY_MAMBA_HYBRID, **TINY_GRANITE, **o}
    ),
    "bailing_hybrid": Reference("BailingHybridForCausalLM", "BailingHybridConfig", lambda o: {**TINY_LING, **o}),
    "jamba": Reference("JambaForCausalLM", "JambaConfig", lambda o: {**TINY_JAMBA, **o}),
    "zamba2": Reference("Zamba2ForCausalLM", "Zamba2Config", lambda o: {**TINY_ZAMBA2, **o}),
    "falcon_h1": Reference("FalconH1ForCausalLM", "FalconH1Config", lambda o: {**TINY_FALCON, **o}),
    "olmo_hybrid": Reference("OlmoHybridForCausalLM", "OlmoHybridConfig", lambda o: {**TINY_OLMO, **o}),
    "kimi_linear": Reference("KimiLinearForCausalLM", "KimiLinearConfig", lambda o: {**TINY_KIMI, **o}),
    "minimax": Reference("MiniMaxForCausalLM", "MiniMaxConfig", lambda o: {**TINY_MINIMAX, **o}),
    "lfm2": Reference("Lfm2ForCausalLM", "Lfm2Config", lambda o: {**TINY_LFM2, **o}),
    "bamba": Reference(
        "BambaForCausalLM", "BambaConfig", lambda o: {**TINY_MAMBA_HYBRID, "attn_layer_indices": [1, 3], **o}
    ),
    "qwen3_next": Reference("Qwen3NextForCausalLM", "Qwen3NextConfig", lambda o: {**TINY, **o, "num_experts": 0}),
    "qwen3_next_moe": Reference(
        "Qwen3NextForCausalLM",
        "Qwen3NextConfig",
        lambda o: {**TINY, **o, **TINY_MOE, "norm_topk_prob": False, "mlp_only_layers": [1]},
    ),
    "qwen3_5_text": Reference(
        "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", lambda o: {"tie_word_embeddings": True, **TINY, **o}
    ),
    "qwen3_5_moe_text": Reference(
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeTextConfig",
        lambda o: {**_without({**TINY, **o}, "intermediate_size"), **TINY_MOE},
        module="transformers.models.qwen3_5_moe",
    ),
}


def build_reference_model(
    kind: str, overrides: dict[str, Any] | None = None, seed: int = 0, small_dt: bool = False
) -> torch.nn.Module:
    """A randomised transformers model of ``kind`` (one of ``KINDS`` with a ``REFERENCES`` entry) on tiny or
    overridden shapes (``small_dt``: ``randomize``'s)."""
    reference = REFERENCES.get(kind)
    if reference is None:
        raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {', '.join(KINDS)}")
    torch.manual_seed(seed)
    module = importlib.import_module(reference.module)
    config = getattr(module, reference.config)(**reference.shapes(dict(overrides or {})))
    model = getattr(module, reference.model)(config)
    randomize(model, seed, small_dt)
    return model.eval()


def build_checkpoint(
    kind: str, out: str | Path, overrides: dict[str, Any] | None = None, seed: int = 0, small_dt: bool = False
) -> Path:
    """Build, randomise and ``save_pretrained`` one checkpoint; returns its directory. ``OWN_KINDS`` (no
    transformers class) are written by ``build_ring_checkpoint`` instead."""
    out = Path(out)
    if kind == "bailing_moe_linear":
        return build_ring_checkpoint(out, overrides, seed)
    build_reference_model(kind, overrides, seed, small_dt).save_pretrained(out)
    return out


# Ring-linear-2.0 on tiny shapes: 4 Lightning layers and softmax every 3rd (layer_group_size 3: layers 2, 5).
TINY_RING: dict[str, Any] = dict(
    model_type="bailing_moe_linear",
    architectures=["BailingMoeLinearV2ForCausalLM"],
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    layer_group_size=3,
    group_norm_size=2,
    linear_silu=False,
    use_qk_norm=True,
    partial_rotary_factor=0.5,
    rope_theta=10000.0,
    max_position_embeddings=1024,
    first_k_dense_replace=1,
    num_experts=8,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    num_shared_experts=1,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=32,
    score_function="sigmoid",
    moe_router_enable_expert_bias=True,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    use_bias=False,
    use_qkv_bias=False,
    tie_word_embeddings=False,
    eos_token_id=1,
    pad_token_id=0,
)
OWN_KINDS = ("bailing_moe_linear",)


def build_ring_checkpoint(out: str | Path, overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A random Ring-linear-2.0 checkpoint as its release lays one out (``config.json`` with the remote code's
    field names; safetensors with experts one module each and the router bias as ``expert_bias``), drawn
    with the same scales as ``randomize``. There is no transformers class to build it with."""
    import json

    from safetensors.torch import save_file

    from hypic_rag.model import HybridModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {**TINY_RING, **(overrides or {})}
    model = HybridModel(read_config(config))
    randomize(model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                tensors[f"{prefix}{e}.gate_proj.weight"], tensors[f"{prefix}{e}.up_proj.weight"] = gate, up
        elif name.endswith("experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e, w in enumerate(t):
                tensors[f"{prefix}{e}.down_proj.weight"] = w
        elif name.endswith("gate.e_score_correction_bias"):  # from the seed, not whatever ran before
            bias = torch.randn(t.shape, generator=generator) * 0.1
            tensors[name.replace("e_score_correction_bias", "expert_bias")] = bias
        else:
            tensors[name] = t
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


# Special tokens of a Qwen-style chat vocabulary: turn delimiters, reasoning and tool-call tags.
# Chat templates of the real checkpoints' styles (ChatML, Qwen3, Qwen3.5), for tests and benchmarks.
TEMPLATES = Path(__file__).parent / "templates"

CHAT_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
CHAT_CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # the special ones among them
_CHAT_CORPUS = (
    "You are a helpful assistant. Answer the question based only on the following context.",
    "Ana Lee lives in Oslo and works as a pilot. Bo Ek lives in Rome. Question: where does Ana live?",
    '{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "string"}}}',
    "The weather in Lima is sunny, 24 degrees. Context information is below. Given the context, answer.",
)


def add_chat_files(
    path: str | Path,
    template: str,
    vocab_size: int = 320,
    generation: dict | None = None,
    texts: list[str] | None = None,
) -> Path:
    """Write a Qwen-style byte-level BPE ``tokenizer.json`` (with ``CHAT_SPECIALS``), a ``tokenizer_config.json``
    carrying ``template`` as its chat template, and a ``generation_config.json`` (EOS: ``<|im_end|>`` and
    ``<|endoftext|>``, plus ``generation``) into a checkpoint directory, as a real checkpoint ships them.
    The BPE learns from ``texts`` (a small fixed corpus by default) up to ``vocab_size`` tokens."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = Path(path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(CHAT_SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(texts or _CHAT_CORPUS) * 10, trainer)
    tok.save(str(path / "tokenizer.json"))
    # As in Qwen's own tokenizer.json, only the ChatML controls are special: decoding keeps the reasoning and
    # tool-call tags, which the answer's parser reads.
    data = json.loads((path / "tokenizer.json").read_text())
    for added in data["added_tokens"]:
        added["special"] = added["content"] in CHAT_CONTROLS
    (path / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, **(generation or {})}))
    return path


def place_in_hub_cache(
    source: str | Path, hf_home: str | Path, repo_id: str, commit: str = "a" * 40, refs: tuple[str, ...] = ("main",)
) -> Path:
    """Lay a checkpoint directory out as huggingface_hub caches a download under ``hf_home``:
    content-named blobs, a snapshot folder of relative symlinks to them, and ``refs/<name>`` files
    holding the commit. Returns the snapshot folder."""
    import hashlib
    import os
    import shutil

    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in Path(source).iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
