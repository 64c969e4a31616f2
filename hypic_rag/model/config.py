"""The model configuration the runtime needs: one type, a leaf of the package (it imports nothing of ours).

Each family reads its own ``config.json`` into it (``families.read_config``: its fields as its checkpoints spell
them, over transformers' defaults); the fields a family does not have default to unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LINEAR = "linear_attention"
FULL = "full_attention"
MLP = "mlp"  # a layer that is only a feed-forward (Nemotron-H's "-")
HYBRID = "hybrid"  # attention and a linear mixer side by side in one layer (Falcon-H1)
MOE = "moe"  # a layer that is only a mixture of experts (Nemotron-H's "E")


@dataclass(frozen=True)
class HybridConfig:
    """The fields of a hybrid model that the runtime needs; each family's own fields default to unused."""

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
    # the clamp on softplus(dt): transformers' ``time_step_limit``, read as each family's class reads it
    time_step_limit: tuple[float, float] = (0.0, float("inf"))
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
