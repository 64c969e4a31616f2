"""Model configuration read from a Hugging Face ``config.json``.

transformers' ``save_pretrained`` writes only the fields that differ from each
class's defaults, so the defaults of every supported ``model_type`` live here:
a missing field must mean what it means to transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LINEAR = "linear_attention"
FULL = "full_attention"
MLP = "mlp"  # a layer that is only a feed-forward (Nemotron-H's "-")
HYBRID = "hybrid"  # attention and a linear mixer side by side in one layer (Falcon-H1)
MOE = "moe"  # a layer that is only a mixture of experts (Nemotron-H's "E")

_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "num_key_value_heads": 2,
    "num_attention_heads": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "eos_token_id": None,
    "bos_token_id": None,
    "pad_token_id": None,
}

# Per model_type defaults, as transformers 5 defines them.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_next": {
        **_COMMON,
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 48,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10,
        "num_experts": 512,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
    },
    "qwen3_5_text": {
        **_COMMON,
        "vocab_size": 248320,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
        "num_experts": 0,
    },
    "qwen3_5_moe_text": {
        **_COMMON,
        "vocab_size": 248320,
        "hidden_size": 2048,
        "intermediate_size": 0,
        "num_hidden_layers": 40,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 8,
        "num_experts": 256,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}

# Top-level model types whose text model lives in ``text_config``.
_WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

# Families read by ``family_configs``, by their linear layers' mixer.
MAMBA2_MODEL_TYPES = ("nemotron_h", "granitemoehybrid", "bamba", "falcon_h1")
MIXERS = {
    **dict.fromkeys(MAMBA2_MODEL_TYPES, "mamba2"),
    "lfm2": "short_conv",
    "minimax": "lightning",
    "kimi_linear": "kda",
    "bailing_hybrid": "kda",
    "olmo_hybrid": "gated_deltanet",
    "bailing_moe_linear": "lightning",
    "jamba": "mamba1",
}
SUPPORTED_MODEL_TYPES = (
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "qwen3_5",
    "qwen3_5_moe",
    *MIXERS,
)


@dataclass(frozen=True)
class HybridConfig:
    """The fields of a hybrid model that the runtime needs: Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5)
    and Mamba2 hybrids (Nemotron-H); each family's own fields default to unused."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    max_position_embeddings: int
    rope_theta: float
    partial_rotary_factor: float
    attention_bias: bool
    tie_word_embeddings: bool
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # Mamba2 (Nemotron-H)
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    mamba_n_groups: int = 1
    mamba_conv_kernel: int = 0
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    time_step_min: float = 0.0
    time_step_max: float = float("inf")
    mamba_norm: str = "gate_then_norm"  # or "norm_then_gate", "none" (Falcon-H1)
    mamba_out_bias: bool | None = None  # None: mamba_proj_bias
    # Mamba1 (Jamba): channels and the dt projection's rank
    mamba1_inner: int = 0
    mamba_dt_rank: int = 0
    mlp_bias: bool = False
    # Granite's multipliers (1 elsewhere); ``attention_scale`` None is 1/sqrt(head_dim)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_scale: float | None = None
    logits_scaling: float = 1.0
    # LFM2's short convolution
    short_conv_kernel: int = 0
    short_conv_bias: bool = False
    # OLMo hybrid's Gated DeltaNet: beta in (0, 2), its own read-out norm eps
    linear_beta_scale: float = 1.0
    linear_norm_eps: float | None = None
    # Kimi Linear's and Ling 3.0's MLA, Ling 3.0's KDA gate
    rope_dim: int | None = None
    kda_safe_gate: bool = False
    kda_lower_bound: float = -5.0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Ring-linear-2.0's Lightning layers
    ring_linear_silu: bool = False
    ring_qk_norm: bool = True
    ring_group_norm_size: int = 1
    ring_linear_rope: bool = True
    # MiniMax's residual scalings: part -> (alpha on the residual, beta on the branch)
    residual_factors: dict[str, tuple[float, float]] = field(default_factory=dict, compare=False)
    moe_latent_size: int | None = None
    moe_n_group: int = 1
    moe_topk_group: int = 1
    routed_scaling_factor: float = 1.0
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def mixer(self) -> str:
        """The linear layers' token mixer (``MIXERS``; ``"gated_deltanet"`` for the Qwen families)."""
        return MIXERS.get(self.model_type, "gated_deltanet")

    @property
    def mamba_intermediate(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        return self.mamba_intermediate + 2 * self.mamba_n_groups * self.ssm_state_size

    @property
    def rotary_dim(self) -> int:
        if self.rope_dim is not None:  # MLA: the rotated part of a head is its own width
            return self.rope_dim
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    def is_moe_layer(self, idx: int) -> bool:
        if self.num_experts <= 0 or idx in self.mlp_only_layers:
            return False
        return (idx + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridConfig:
        if not isinstance(data, dict):
            raise ValueError("config must be a JSON object")
        model_type = data.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}: hypic-rag runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if model_type in MIXERS:
            from .family_configs import READERS

            try:
                cfg = READERS[model_type](cls, data)
                cfg._validate()
            except ValueError as exc:
                raise ValueError(f"invalid {model_type} config.json: {exc}") from exc
            except (TypeError, ZeroDivisionError, KeyError, AttributeError, IndexError) as exc:
                # A field of the wrong type, a zero size, a missing sub-field: the reader's arithmetic failed.
                raise ValueError(f"invalid {model_type} config.json: {type(exc).__name__}: {exc}") from exc
            return cfg
        top = data
        if model_type in _WRAPPERS:
            text = data.get("text_config")
            if not isinstance(text, dict):
                raise ValueError(f"model_type {model_type!r} needs a 'text_config' object")
            text_type = _WRAPPERS[model_type]
            data = {**text}
            if "tie_word_embeddings" in top:
                data["tie_word_embeddings"] = top["tie_word_embeddings"]
            data.setdefault("eos_token_id", top.get("eos_token_id"))
            model_type = text_type
        d = {**_DEFAULTS[model_type], **{k: v for k, v in data.items() if v is not None or k.endswith("token_id")}}
        d["model_type"] = model_type
        n_layers = int(d["num_hidden_layers"])
        layer_types = d.get("layer_types")
        if layer_types is None:
            interval = int(d.get("full_attention_interval", 4))
            layer_types = [LINEAR if (i + 1) % interval else FULL for i in range(n_layers)]
        layer_types = tuple(layer_types)
        if len(layer_types) != n_layers or any(t not in (LINEAR, FULL) for t in layer_types):
            raise ValueError(
                f"layer_types must list {n_layers} entries of {LINEAR!r} or {FULL!r}, got {list(layer_types)}"
            )
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"unsupported rope_type {rope_type!r}: only 'default' RoPE is implemented")
        theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25)))
        if model_type == "qwen3_5_moe_text":
            d["norm_topk_prob"] = True  # its router always renormalises
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        if d["hidden_act"] != "silu":
            raise ValueError(f"unsupported hidden_act {d['hidden_act']!r}: only 'silu' is implemented")
        cfg = cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d.get("intermediate_size") or 0),
            num_hidden_layers=n_layers,
            layer_types=layer_types,
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d["num_key_value_heads"]),
            head_dim=int(d["head_dim"]),
            linear_num_key_heads=int(d["linear_num_key_heads"]),
            linear_num_value_heads=int(d["linear_num_value_heads"]),
            linear_key_head_dim=int(d["linear_key_head_dim"]),
            linear_value_head_dim=int(d["linear_value_head_dim"]),
            linear_conv_kernel_dim=int(d["linear_conv_kernel_dim"]),
            rms_norm_eps=float(d["rms_norm_eps"]),
            hidden_act=d["hidden_act"],
            max_position_embeddings=int(d["max_position_embeddings"]),
            rope_theta=theta,
            partial_rotary_factor=partial,
            attention_bias=bool(d["attention_bias"]),
            tie_word_embeddings=bool(d["tie_word_embeddings"]),
            num_experts=int(d.get("num_experts") or 0),
            num_experts_per_tok=int(d.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(d.get("moe_intermediate_size") or 0),
            shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            decoder_sparse_step=int(d.get("decoder_sparse_step") or 1),
            mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
            eos_token_ids=eos_ids,
            bos_token_id=d.get("bos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            raw=dict(top),
        )
        cfg._validate()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> HybridConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"no config.json at {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def _validate(self) -> None:
        sizes = ["vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings"]
        if FULL in self.layer_types or HYBRID in self.layer_types:
            sizes += ["num_attention_heads", "num_key_value_heads", "head_dim"]
        recurrent_sizes = self.mixer not in ("short_conv", "lightning", "mamba1")
        if (LINEAR in self.layer_types or HYBRID in self.layer_types) and recurrent_sizes:
            sizes += (
                ["mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_n_groups", "mamba_conv_kernel"]
                if self.mixer == "mamba2"
                else [
                    "linear_num_key_heads",
                    "linear_num_value_heads",
                    "linear_key_head_dim",
                    "linear_value_head_dim",
                    "linear_conv_kernel_dim",
                ]
            )
        for name in sizes:
            if getattr(self, name) < 1:
                raise ValueError(f"config {name} must be >= 1, got {getattr(self, name)}")
        if "num_key_value_heads" in sizes and self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.mixer == "mamba1":
            for name in ("mamba1_inner", "mamba_dt_rank", "ssm_state_size", "mamba_conv_kernel", "intermediate_size"):
                if LINEAR in self.layer_types and getattr(self, name) < 1:
                    raise ValueError(f"config {name} must be >= 1, got {getattr(self, name)}")
            if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError("num_experts_per_tok must be between 1 and num_experts")
            return
        if self.mixer == "kda":
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise ValueError(f"rotary dim {self.rotary_dim} must be even and within head_dim {self.head_dim}")
            groups_ok = not self.num_experts % self.moe_n_group and 0 < self.moe_topk_group <= self.moe_n_group
            if self.num_experts and not groups_ok:
                raise ValueError("num_experts must split into n_group groups, topk_group of them picked")
            if self.v_head_dim > self.head_dim:
                raise ValueError(f"v_head_dim {self.v_head_dim} is wider than the query-key head {self.head_dim}")
            if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError("num_experts_per_token must be between 1 and num_experts")
            return
        if self.mixer == "lightning":
            if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError("num_experts_per_tok must be between 1 and the number of experts")
            if self.num_experts % self.moe_n_group or not 0 < self.moe_topk_group <= self.moe_n_group:
                raise ValueError("num_experts must split into n_group groups, topk_group of them picked")
            inner = self.num_attention_heads * self.head_dim
            if LINEAR in self.layer_types and inner % self.ring_group_norm_size:
                raise ValueError(f"group_norm_size {self.ring_group_norm_size} does not divide {inner} channels")
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise ValueError(f"rotary dim {self.rotary_dim} must be even and within head_dim {self.head_dim}")
            return
        if self.mixer == "short_conv":
            if LINEAR in self.layer_types and self.short_conv_kernel < 1:
                raise ValueError(f"conv_L_cache must be >= 1, got {self.short_conv_kernel}")
            if self.intermediate_size < 1:
                raise ValueError(f"the feed-forward size must be >= 1, got {self.intermediate_size}")
            return
        if self.mixer == "mamba2":
            if "mamba_num_heads" in sizes and self.mamba_num_heads % self.mamba_n_groups:
                raise ValueError("mamba_num_heads must be a multiple of n_groups")
            feed_forward = MLP in self.layer_types or self.model_type != "nemotron_h"
            if feed_forward and self.intermediate_size <= 0:
                raise ValueError(f"the feed-forward layers need a size >= 1, got {self.intermediate_size}")
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise ValueError(f"rotary dim {self.rotary_dim} must be even and within head_dim {self.head_dim}")
            if self.num_experts:
                if not 0 < self.num_experts_per_tok <= self.num_experts:
                    raise ValueError("num_experts_per_tok must be between 1 and the number of experts")
                if self.num_experts % self.moe_n_group or not 0 < self.moe_topk_group <= self.moe_n_group:
                    raise ValueError("n_routed_experts must split into n_group groups, topk_group of them picked")
            return
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        no_rope = self.rotary_dim == 0 and self.model_type == "olmo_hybrid"  # OLMo hybrid may run NoPE
        if self.rotary_dim % 2 or not (0 < self.rotary_dim or no_rope) or self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary dim {self.rotary_dim} must be even and within head_dim {self.head_dim}")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError("num_experts_per_tok must be between 1 and num_experts")
        dense_layers = [i for i in range(self.num_hidden_layers) if not self.is_moe_layer(i)]
        if dense_layers and self.intermediate_size <= 0:
            raise ValueError(f"layers {dense_layers} are dense but intermediate_size is {self.intermediate_size}")
