"""The hybrid decoder stack: embeddings, alternating Gated DeltaNet and gated-attention layers, LM head."""

from __future__ import annotations

import torch
from torch import nn

from hypic_rag.kernels.rope import rope_cos_sin, rope_inv_freq

from .attention import GatedAttention
from .block import PreNormLayer
from .config import LINEAR, HybridConfig
from .deltanet import GatedDeltaNet
from .layers import MLP, RMSNorm, SparseMoE
from .state import RequestState, SegmentJumps, TransitionCapture

# Where an input embedding is not ``model.embed_tokens``.
_EMBEDDINGS = {
    "nemotron_h": "backbone.embeddings.weight",
    "bailing_moe_linear": "model.word_embeddings.weight",
    "bailing_hybrid": "model.word_embeddings.weight",
}
# What each family calls its linear layers' token mixer (Qwen, Granite/Bamba, LFM2, Nemotron-H, MiniMax).
_MIXER_NAMES = ("linear_attn", "mamba", "conv", "mixer", "self_attn", "attention")


class DecoderLayer(PreNormLayer):
    """Qwen3-Next's and Qwen3.5's layer: Gated DeltaNet or gated attention, then a SwiGLU or a MoE."""

    def __init__(self, config: HybridConfig, idx: int) -> None:
        linear = config.layer_types[idx] == LINEAR
        mixer = ("linear_attn", GatedDeltaNet(config, idx)) if linear else ("self_attn", GatedAttention(config, idx))
        ffn = SparseMoE(config) if config.is_moe_layer(idx) else MLP(config.hidden_size, config.intermediate_size)
        super().__init__(
            linear,
            mixer,
            ("mlp", ffn),
            ("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps)),
            ("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps)),
        )


class Backbone(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class HybridModel(nn.Module):
    """``model(input_ids)`` is a plain causal forward returning logits ``[B, T, V]``.

    With a request ``state`` it continues from it and updates it; ``positions`` default to
    ``state.seq_len + arange(T)``.
    """

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.config = config
        if config.model_type == "nemotron_h":
            from .nemotron_h import NemotronBackbone

            self.backbone = NemotronBackbone(config)
            self._stack = (self.backbone.embeddings, self.backbone.layers, self.backbone.norm_f)
        elif config.model_type == "jamba":
            from .jamba import JambaBackbone

            self.model = JambaBackbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.final_layernorm)
        elif config.model_type == "bailing_moe_linear":
            from .bailing_linear import RingBackbone

            self.model = RingBackbone(config)
            self._stack = (self.model.word_embeddings, self.model.layers, self.model.norm)
        elif config.model_type == "falcon_h1":
            from .mamba_hybrids import FalconH1Backbone

            self.model = FalconH1Backbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.final_layernorm)
        elif config.model_type == "olmo_hybrid":
            from .olmo_hybrid import OlmoHybridBackbone

            self.model = OlmoHybridBackbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.norm)
        elif config.model_type == "bailing_hybrid":
            from .kimi_linear import BailingHybridBackbone

            self.model = BailingHybridBackbone(config)
            self._stack = (self.model.word_embeddings, self.model.layers, self.model.norm)
        elif config.model_type == "kimi_linear":
            from .kimi_linear import KimiBackbone

            self.model = KimiBackbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.norm)
        elif config.model_type == "minimax":
            from .minimax import MiniMaxBackbone

            self.model = MiniMaxBackbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.norm)
        elif config.model_type == "lfm2":
            from .lfm2 import Lfm2Backbone

            self.model = Lfm2Backbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.embedding_norm)
        elif config.model_type in ("granitemoehybrid", "bamba"):
            from .mamba_hybrids import MambaHybridBackbone

            self.model = MambaHybridBackbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.final_norm)
        else:
            self.model = Backbone(config)
            self._stack = (self.model.embed_tokens, self.model.layers, self.model.norm)
        self._mixers: dict[int, nn.Module] = {
            i: next(getattr(layer, n) for n in _MIXER_NAMES if hasattr(layer, n))
            for i, layer in enumerate(self._stack[1])
            if layer.is_linear
        }
        self._forms = {i: mixer.operator_form for i, mixer in self._mixers.items()}
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(config.rotary_dim, config.rope_theta), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def embedding_name(self) -> str:
        """The input embedding's parameter name (an LM head tied to it loads from it)."""
        return _EMBEDDINGS.get(self.config.model_type, "model.embed_tokens.weight")

    def linear_mixers(self) -> dict[int, nn.Module]:
        """Each linear layer's token mixer (``operator_form``, ``state_shapes()``), found once at build."""
        return self._mixers

    @property
    def operator_forms(self) -> dict[int, str]:
        """Each linear layer's operator form (``kernels.algebra.FORMS``)."""
        return self._forms

    def new_state(self) -> RequestState:
        return RequestState(self.config)

    def check_input_ids(self, input_ids: torch.Tensor, start: int = 0) -> None:
        """Raise ``ValueError`` for ids the model cannot embed or positions past its context."""
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, tokens] with tokens > 0, got {tuple(input_ids.shape)}")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = hi if hi >= self.config.vocab_size else lo
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        end = start + input_ids.shape[1]
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"prompt of {end} tokens is past max_position_embeddings={self.config.max_position_embeddings}"
            )

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        state: RequestState | None = None,
        positions: torch.Tensor | None = None,
        pad_mask: torch.Tensor | None = None,
        capture: TransitionCapture | None = None,
        jumps: SegmentJumps | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[B, T, H]``; ``pad_mask [B, T]`` marks real tokens of left-padded
        rows; ``capture`` records the linear layers' segment operators of a zero-start forward;
        ``jumps`` skips over cached segments between the tokens of a fused forward (whose ``positions``
        then say where each token sits)."""
        start = state.seq_len if state is not None else 0
        self.check_input_ids(input_ids, start)
        t = input_ids.shape[1]
        if positions is None:
            positions = torch.arange(start, start + t, device=input_ids.device)
        elif positions.shape != (t,) or int(positions.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"positions must be [{t}] ints below max_position_embeddings={self.config.max_position_embeddings}"
            )
        embed, layers, norm = self._stack
        x = embed(input_ids)
        if self.config.embedding_multiplier != 1.0:
            x = x * self.config.embedding_multiplier
        rope = (*rope_cos_sin(self.inv_freq, positions, x.dtype), self.inv_freq)
        for layer in layers:
            x = layer(x, positions, rope, state, pad_mask, capture, jumps)
        if state is not None:
            state.advance(t)
        return norm(x)

    def forward(
        self,
        input_ids: torch.Tensor,
        state: RequestState | None = None,
        positions: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        pad_mask: torch.Tensor | None = None,
        jumps: SegmentJumps | None = None,
    ) -> torch.Tensor:
        """Logits for every token, or for the last ``logits_to_keep`` when it is positive."""
        h = self.hidden_states(input_ids, state, positions, pad_mask, jumps=jumps)
        if logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(h)
        return logits if self.config.logits_scaling == 1.0 else logits / self.config.logits_scaling
