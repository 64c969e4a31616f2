"""The linear token mixers, one module each, that families put in their linear layers.

Every mixer has an ``operator_form`` (``kernels.algebra.FORMS``: how a segment's state crosses a boundary),
``state_shapes()`` (one segment's cached end state ``b``, operator ``p`` and conv tail) and
``forward(x, ctx)`` (``context.Forward``): a plain forward, an isolated zero-start prefill that records its
segment operators (``ctx.capture``), or a fused one that jumps over cached segments (``ctx.jumps``). ``conv``
and ``recurrence`` are the parts the mixers share.
"""

# The names a family's ``mixer`` may take, each the module of that name here (``gated_deltanet``: ``deltanet``).
NAMES = ("gated_deltanet", "mamba1", "mamba2", "kda", "lightning", "short_conv")
