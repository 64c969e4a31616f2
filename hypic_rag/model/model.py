"""The hybrid decoder stack: embeddings, the family's decoder layers (linear mixers and attention), LM head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hypic_rag.kernels.rope import rope_cos_sin, rope_inv_freq

from .batch import BatchState
from .config import HybridConfig
from .context import Forward
from .families import family_of
from .family import Family
from .linear import Linear, LMHead, decoding
from .state import RequestState, SegmentJumps, StateMarks, TransitionCapture


class Backbone(nn.Module):
    """The stack every family shares: the input embedding, the decoder layers and the final norm, under
    the names the family's checkpoints give them."""

    def __init__(self, config: HybridConfig, family: Family) -> None:
        super().__init__()
        self.add_module(family.embeddings, nn.Embedding(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(family.layer(config, i) for i in range(config.num_hidden_layers))
        self.add_module(family.final_norm, family.norm(config.hidden_size, config.rms_norm_eps))


class HybridModel(nn.Module):
    """``model(input_ids)`` is a plain causal forward returning logits ``[B, T, V]``.

    With a request ``state`` it continues from it and updates it; ``positions`` default to
    ``state.seq_len + arange(T)``.
    """

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.config = config
        self.family = family = family_of(config.model_type)
        backbone = Backbone(config, family)
        self.add_module(family.root, backbone)  # ``model`` (``backbone`` for Nemotron-H), as checkpoints name it
        self._stack = (getattr(backbone, family.embeddings), backbone.layers, getattr(backbone, family.final_norm))
        self._mixers: dict[int, nn.Module] = {
            i: layer.linear_mixer for i, layer in enumerate(backbone.layers) if layer.is_linear
        }
        self._forms = {i: mixer.operator_form for i, mixer in self._mixers.items()}
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
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
        return self.family.embedding_weight

    def linear_mixers(self) -> dict[int, nn.Module]:
        """Each linear layer's token mixer (``operator_form``, ``state_shapes()``), found once at build."""
        return self._mixers

    @property
    def operator_forms(self) -> dict[int, str]:
        """Each linear layer's operator form (``kernels.algebra.FORMS``)."""
        return self._forms

    def new_state(self) -> RequestState:
        return RequestState(self.config)

    def pack_weights(self, on: bool = True, head: bool | None = None) -> None:
        """Whether the decoder's projections (and the LM head: ``head``, the same unless given) run CPU fp32
        inference on packed weight copies (``linear.Linear``); off frees the copies."""
        for module in self.modules():
            if isinstance(module, Linear) and module is not self.lm_head:
                module.pack = on
        self.lm_head.pack = on if head is None else head

    def decode_int8(self, on: bool = True) -> None:
        """Whether decode steps read 8-bit copies of every projection's weight, the LM head's too
        (``linear.Linear.int8``); prompts still run on the float weights. Off frees the copies."""
        self._decode_copies("int8", on)

    @property
    def decodes_int8(self) -> bool:
        return self.lm_head.int8

    def decode_bf16(self, on: bool = True) -> None:
        """As ``decode_int8``, with bfloat16 copies (``linear.Linear.bf16``)."""
        self._decode_copies("bf16", on)

    @property
    def decodes_bf16(self) -> bool:
        return self.lm_head.bf16

    def _decode_copies(self, kind: str, on: bool) -> None:
        for module in self.modules():
            if isinstance(module, Linear):
                setattr(module, kind, on)

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
        through_layer: int | None = None,
        marks: StateMarks | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[B, T, H]``; ``pad_mask [B, T]`` marks real tokens of left-padded
        rows; ``capture`` records the linear layers' segment operators of a zero-start forward;
        ``jumps`` skips over cached segments between the tokens of a fused forward (whose ``positions``
        then say where each token sits). ``through_layer`` stops after that layer (a probe of the first
        layers: the residual stream there, and ``state`` left partly written, for a throwaway state). ``marks``
        get the linear layers' states where they say, in a forward run in context."""
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
        ctx = Forward(positions, rope, state, pad_mask, capture, jumps, embeds=x, marks=marks)
        for i, layer in enumerate(layers):
            x = layer(x, ctx)
            if i == through_layer:
                return x
        if state is not None:
            state.advance(t)
        return norm(x)

    def decode_batch(self, tokens: Sequence[int], states: Sequence[RequestState]) -> torch.Tensor:
        """Next-token logits ``[B, V]`` after one token per request, each continuing (and updating) its own
        state at its own position: a continuous batch's decode step (``batch.BatchState``)."""
        with decoding():
            return self._decode_batch(tokens, states)

    def _decode_batch(self, tokens: Sequence[int], states: Sequence[RequestState]) -> torch.Tensor:
        batch = BatchState(states)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)[:, None]
        if ids.shape[0] != len(batch.rows):
            raise ValueError(f"{ids.shape[0]} tokens for {len(batch.rows)} request states")
        self.check_input_ids(ids, batch.seq_len)
        positions = batch.positions.to(self.device)
        embed, layers, norm = self._stack
        x = embed(ids)
        if self.config.embedding_multiplier != 1.0:
            x = x * self.config.embedding_multiplier
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        rope = (cos[:, None, None], sin[:, None, None], self.inv_freq)  # [B, 1, 1, rot]: a position per row
        ctx = Forward(positions, rope, batch, embeds=x)
        for layer in layers:
            x = layer(x, ctx)
        batch.advance(1)
        logits = self.lm_head(norm(x)[:, 0])
        return logits if self.config.logits_scaling == 1.0 else logits / self.config.logits_scaling

    def forward(
        self,
        input_ids: torch.Tensor,
        state: RequestState | None = None,
        positions: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        pad_mask: torch.Tensor | None = None,
        jumps: SegmentJumps | None = None,
        marks: StateMarks | None = None,
    ) -> torch.Tensor:
        """Logits for every token, or for the last ``logits_to_keep`` when it is positive."""
        h = self.hidden_states(input_ids, state, positions, pad_mask, jumps=jumps, marks=marks)
        if logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(h)
        return logits if self.config.logits_scaling == 1.0 else logits / self.config.logits_scaling
