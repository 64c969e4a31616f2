"""The gated delta rule over a request's fresh tokens, with the state jumping over cached segments.

Why: a request recomputes only some of its tokens (seams, in-context stretches, the
query); between them sit cached segments, whose effect on a linear layer's state is the affine map
``S <- P @ S_src + B`` (docs/design.md §3: ``P`` the segment's transition operator, ``B`` its zero-start
end state). Running every fresh stretch in its own forward reads all of the model's weights once
per stretch; ``scan_with_jumps`` lets the fresh tokens go through ONE forward, as one sequence, each
linear layer scanning them once and applying the cached segments' maps where they sit.

Semantics, exactly. Tokens ``0 .. T-1`` run the recurrence (transformers' and fla's convention)

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

from ``initial_state`` (zero when None). When the count of tokens processed reaches ``at[j]`` the
state is replaced by ``p[j] @ S_(src[j]) + b[j]``, where ``S_(src[j])`` is the state after the
first ``src[j]`` tokens as it was at that moment: jumps sharing an index apply in their order, so a
jump whose ``src`` equals an earlier jump's ``at`` sees the state after that earlier jump, and
``src == at`` means the current state. ``src[j] < at[j]`` re-composes the cached segment onto the
state before the last ``at[j] - src[j]`` tokens (a seam recomputed for its outputs only, variant A);
those tokens still produce outputs. ``src[j] >= at[j-1]`` (a source never lies before the previous
jump), so at most one saved source is pending at any time. A jump at ``T`` changes only the final
state, a jump at 0 the state before the first token.

Both backends walk the same plan (``_plan``): the tokens split into pieces at every ``at`` and
``src``; after each piece come the jumps at its end and, where a later jump takes its source there,
a saved copy of the state. The torch reference runs one chunked pass with the pieces laid out on
whole chunks and the jumps applied between them (``chunk_gated_delta_rule_hooked``); the Triton
kernel is one program per (head, block of value columns) holding the state in registers across all
pieces, so each head's fresh tokens stream through once. The plan is built on the host from ``at``
and ``src``: keep those on the CPU (reading them from the GPU is a sync per call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .algebra import DeltaTokens
from .backend import HAS_TRITON, resolve
from .delta_rule import chunk_gated_delta_rule_hooked
from .indices import int64

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# Flags of a plan step, after its piece and its jump.
_FROM_SAVED = 1  # the jump's source is the saved state, not the current one
_SAVE = 2  # keep the state as the source of a later jump


@dataclass(frozen=True)
class Jumps:
    """Where the state jumps over cached segments; see the module docstring.

    ``at [J]`` int64, ascending, in ``[0, T]``: the jump happens after the first ``at[j]`` tokens.
    ``src [J]`` int64, ``at[j-1] <= src[j] <= at[j]``: the jump composes onto the state after the
    first ``src[j]`` tokens. ``p [J, H, K, K]`` and ``b [J, H, K, V]`` fp32: ``S <- p[j] @ S + b[j]``.
    ``tokens``, when given, has one item per jump: a ``DeltaTokens`` (a short segment's map kept as its tokens,
    applied without forming ``P``) or None, and ``p``, ``b`` then hold the None jumps' operators only, in order."""

    at: torch.Tensor
    src: torch.Tensor
    p: torch.Tensor
    b: torch.Tensor
    tokens: tuple[DeltaTokens | None, ...] | None = None

    def dense_index(self) -> list[int]:
        """Per jump, its row of ``p`` and ``b`` (-1 for a jump kept as tokens)."""
        if self.tokens is None:
            return list(range(self.at.shape[0]))
        rows, n = [], 0
        for t in self.tokens:
            rows.append(-1 if t is not None else n)
            n += t is None
        return rows

    def all_dense(self) -> Jumps:
        """The same jumps with every operator dense: for the Triton kernel, which reads them from ``p`` and ``b``."""
        if self.tokens is None or all(t is None for t in self.tokens):
            return self
        rows = self.dense_index()
        made = [t.dense() if t is not None else (self.p[r], self.b[r]) for t, r in zip(self.tokens, rows, strict=True)]
        return Jumps(self.at, self.src, torch.stack([p for p, _ in made]), torch.stack([b for _, b in made]))


def _check(q, k, v, g, beta, initial_state, jumps, chunk_size) -> tuple[list[int], list[int]]:
    """Raise ValueError on any malformed input; return ``at`` and ``src`` as lists."""
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
            raise ValueError(f"{name} must be a float16, bfloat16 or float32 tensor")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k must be [1, T, H, K] and v [1, T, H, V]; got {tuple(q.shape)}, {tuple(v.shape)}")
    if q.shape[0] != 1:
        raise ValueError(f"batch 1 only (one request); got {q.shape[0]}")
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must be [1, T, H, K] and v [1, T, H, V]; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")  # fmt: skip
    _, t, h, dk = q.shape
    dv = v.shape[-1]
    if g.shape != q.shape[:3] or beta.shape != q.shape[:3]:
        raise ValueError(f"g and beta must be [1, T, H] = {tuple(q.shape[:3])}")
    if initial_state is not None:
        if initial_state.shape != (1, h, dk, dv):
            raise ValueError(f"initial_state must be [1, H, K, V] = {(1, h, dk, dv)}")
        if not initial_state.is_floating_point() or initial_state.device != q.device:
            raise ValueError(f"initial_state must be a float tensor on {q.device}")
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"chunk_size must be 16, 32, 64 or 128; got {chunk_size}")
    if jumps is None:
        return [], []
    if not isinstance(jumps, Jumps):
        raise ValueError(f"jumps must be a Jumps; got {type(jumps).__name__}")
    at, src, p, b = jumps.at, jumps.src, jumps.p, jumps.b
    if at.dtype != torch.int64 or src.dtype != torch.int64:
        raise ValueError("jumps.at and jumps.src must be int64")
    if at.dim() != 1 or src.shape != at.shape:
        raise ValueError(f"jumps.at and jumps.src must be [J]; got {tuple(at.shape)}, {tuple(src.shape)}")
    if jumps.tokens is not None:
        if len(jumps.tokens) != at.shape[0]:
            raise ValueError(f"jumps.tokens must have one item per jump ({at.shape[0]}); got {len(jumps.tokens)}")
        for j, tok in enumerate(jumps.tokens):
            if tok is not None and (tok.k.shape[::2] != (h, dk) or tok.v.shape[::2] != (h, dv)):
                raise ValueError(f"jumps.tokens[{j}] has keys {tuple(tok.k.shape)}, values {tuple(tok.v.shape)}; "
                                 f"expected [{h}, L, {dk}] and [{h}, L, {dv}]")  # fmt: skip
    n = sum(t is None for t in jumps.tokens) if jumps.tokens is not None else at.shape[0]
    if p.shape != (n, h, dk, dk) or b.shape != (n, h, dk, dv):
        raise ValueError(f"jumps.p must be [J, H, K, K] = {(n, h, dk, dk)} and jumps.b [J, H, K, V] = "
                         f"{(n, h, dk, dv)}; got {tuple(p.shape)}, {tuple(b.shape)}")  # fmt: skip
    if p.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"jumps.p and jumps.b must be float32; got {p.dtype}, {b.dtype}")
    if p.device != q.device or b.device != q.device:
        raise ValueError(f"jumps.p and jumps.b must be on {q.device}")
    at_l, src_l = at.tolist(), src.tolist()
    for j, (a, s) in enumerate(zip(at_l, src_l, strict=True)):
        if not 0 <= a <= t:
            raise ValueError(f"jumps.at[{j}] = {a} is outside [0, {t}]")
        if j and a < at_l[j - 1]:
            raise ValueError(f"jumps.at must be sorted ascending; got {at_l}")
        low = at_l[j - 1] if j else 0
        if not low <= s <= a:
            raise ValueError(f"jumps.src[{j}] = {s} must lie in [{low}, {a}] (the previous jump .. its own at)")
    return at_l, src_l


def _plan(at: list[int], src: list[int], t: int) -> list[tuple[int, int, int, int]]:
    """Steps ``(lo, hi, jump, flags)``: run tokens ``[lo, hi)``, then apply ``jump`` (-1: none; from
    the saved state when ``flags & _FROM_SAVED``), then save the state when ``flags & _SAVE``.

    A source ``src[j] < at[j]`` is saved after every jump at ``src[j]``: those all precede ``j``, and
    no later jump shares it (``src[j+1] >= at[j] > src[j]``)."""
    sources = {s for s, a in zip(src, at, strict=True) if s < a}
    steps: list[tuple[int, int, int, int]] = []
    cur = 0
    for pos in sorted(set(at) | sources | {t}):
        jumps = [j for j, a in enumerate(at) if a == pos] or [-1]
        for j in jumps:
            steps.append((cur, pos, j, _FROM_SAVED if j >= 0 and src[j] < at[j] else 0))
            cur = pos
        if pos in sources:
            lo, hi, j, flags = steps[-1]
            steps[-1] = (lo, hi, j, flags | _SAVE)
    return steps


def scan_pieces(
    t: int,
    at: list[int],
    src: list[int],
    state: torch.Tensor,
    run: Callable[[int, int, torch.Tensor], torch.Tensor],
    jump: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Any mixer through the same plan, a piece at a time: ``run(lo, hi, state)`` advances the state over
    fresh tokens ``[lo, hi)`` (recording their outputs), ``jump(j, source)`` returns jump ``j``'s state
    from ``source`` (the current state, or the one saved at ``src[j]``). Returns the final state.

    The mixers whose operators are cheap (a scalar per head: Mamba2) use this instead of a fused kernel:
    their per-piece scans are short, and the jumps elementwise."""
    saved = state
    for lo, hi, j, flags in _plan(at, src, t):
        if hi > lo:
            state = run(lo, hi, state)
        if j >= 0:
            state = jump(j, saved if flags & _FROM_SAVED else state)
        if flags & _SAVE:
            saved = state
    return state


def scan_with_jumps_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    jumps: Jumps | None = None,
    *,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of ``scan_with_jumps``: one chunked pass over the pieces laid out on whole chunks
    (of the size, up to ``chunk_size``, that pads them least), the jumps applied between chunks."""
    at, src = _check(q, k, v, g, beta, initial_state, jumps, chunk_size)
    return _reference(q, k, v, g, beta, initial_state, jumps, _plan(at, src, q.shape[1]), chunk_size)


def _reference(q, k, v, g, beta, initial_state, jumps, steps, chunk_size, saved=None):
    """All pieces in ONE chunked pass: each piece is laid out on whole chunks (padded at its end with
    identity tokens: k = v = g = beta = 0), so its boundaries are chunk boundaries, where the pass's hook
    applies the jumps; the per-chunk work that does not depend on the state runs batched for them all.
    ``saved``, when given, gets every state the plan saves, ``[H, K, V]``, in order."""
    _, t, h, dk = k.shape
    size = _chunk_for(steps, chunk_size)
    actions: dict[int, list[tuple[int, int]]] = {}
    index: list[int] = []  # where each real token sits in the padded layout
    chunks = 0
    for lo, hi, j, flags in steps:
        if hi > lo:
            index += range(chunks * size, chunks * size + hi - lo)
            chunks += -(-(hi - lo) // size)
        actions.setdefault(chunks, []).append((j, flags))
    where = int64(index, q.device)

    def laid_out(x: torch.Tensor) -> torch.Tensor:  # [1, T, H, ...] -> [1, H, chunks * size, ...]
        padded = x.new_zeros(1, chunks * size, *x.shape[2:], dtype=torch.float32)
        padded[:, where] = x.float()
        return padded.transpose(1, 2)

    saved = saved if saved is not None else []
    rows = jumps.dense_index() if jumps is not None else []

    def hook(c: int, state: torch.Tensor) -> None:  # state [H, K, V] (batch 1)
        for j, flags in actions.get(c, ()):
            if j >= 0:
                source = saved[-1] if flags & _FROM_SAVED else state
                if rows[j] < 0:  # a segment kept as its tokens: the rule run over them, P never formed
                    state.copy_(jumps.tokens[j].apply(source))
                else:
                    state.copy_(torch.baddbmm(jumps.b[rows[j]], jumps.p[rows[j]], source))
            if flags & _SAVE:
                saved.append(state.clone())

    out, state = chunk_gated_delta_rule_hooked(*(laid_out(x) for x in (q, k, v, g, beta)), initial_state, size, hook)
    return out.transpose(1, 2)[:, where], state


def scan_marked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    at: Sequence[int],
    *,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The gated delta rule over ``T`` tokens (shaped as for ``scan_with_jumps``, no jumps) with the state after
    each of ``at`` (ascending, in ``[0, T)``) of them, ``[1, H, K, V]``: the pieces between them laid out on whole
    chunks, as the jumps' pieces are, so that one chunked pass serves them all (a pass per piece pays its fixed
    cost again)."""
    _check(q, k, v, g, beta, initial_state, None, chunk_size)
    t, shape = q.shape[1], (1, q.shape[2], q.shape[3], v.shape[3])
    if list(at) != sorted(set(at)) or any(not 0 <= m < t for m in at):
        raise ValueError(f"the marks {list(at)} must be ascending, in [0, {t})")
    cuts = [0, *at, t]
    steps = [(lo, hi, -1, _SAVE if hi < t else 0) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
    saved: list[torch.Tensor] = []
    out, state = _reference(q, k, v, g, beta, initial_state, None, steps, chunk_size, saved)
    return out, state, [s.view(shape) for s in saved]


def scan_with_jumps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    jumps: Jumps | None = None,
    *,
    chunk_size: int = 64,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[1, T, H, V]`` and the final state ``[1, H, K, V]``, both fp32, of the gated delta
    rule over ``T`` fresh tokens whose state jumps as ``jumps`` says (see the module docstring).

    ``q, k [1, T, H, K]`` (q scaled and L2-normalised, k L2-normalised), ``v [1, T, H, V]``,
    ``g, beta [1, T, H]``; ``initial_state [1, H, K, V]`` or None (zero). ``chunk_size`` caps the
    chunk (16, 32, 64 or 128); shorter pieces use shorter chunks. ValueError on malformed input."""
    at, src = _check(q, k, v, g, beta, initial_state, jumps, chunk_size)
    steps = _plan(at, src, q.shape[1])
    if resolve(backend, q) == "triton":
        return _scan_with_jumps_triton(q, k, v, g, beta, initial_state, jumps, steps, chunk_size)
    return _reference(q, k, v, g, beta, initial_state, jumps, steps, chunk_size)


# -- Triton -------------------------------------------------------------------------------------

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .algebra import block_size, wy_chunk

    @triton.jit
    def _scan_kernel(
        Q, K, V, G, BETA, S0, P, B, O, STATE, STEPS,
        N_STEPS, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
        HAS_S0: tl.constexpr, SAVES: tl.constexpr,
    ):  # fmt: skip
        """One head and one block of BV value columns per program; the state block ``[BK, BV]`` (and
        the one pending saved source) stays in registers while the plan's pieces stream past."""
        h = tl.program_id(0)
        rt = tl.arange(0, BT)
        rk = tl.arange(0, BK)
        cols = tl.program_id(1) * BV + tl.arange(0, BV)
        mk = rk < DK
        mv = cols < DV
        kv_mask = mk[:, None] & mv[None, :]
        kv_off = (h * DK + rk[:, None]) * DV + cols[None, :]
        if HAS_S0:
            state = tl.load(S0 + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        else:
            state = tl.zeros([BK, BV], dtype=tl.float32)
        saved = state
        for step in range(N_STEPS):
            lo = tl.load(STEPS + step * 4)
            hi = tl.load(STEPS + step * 4 + 1)
            jump = tl.load(STEPS + step * 4 + 2)
            flags = tl.load(STEPS + step * 4 + 3)
            for c in range(lo, hi, BT):
                t_idx = c + rt
                mt = t_idx < hi  # tokens past the piece's end are identities: k = 0, g = 0, beta = 0
                tok = t_idx * H + h
                kc = tl.load(K + tok[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
                kc = kc.to(tl.float32)
                qc = tl.load(Q + tok[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
                qc = qc.to(tl.float32)
                vc = tl.load(V + tok[:, None] * DV + cols[None, :], mask=mt[:, None] & mv[None, :], other=0.0)
                vc = vc.to(tl.float32)
                gc = tl.load(G + tok, mask=mt, other=0.0).to(tl.float32)
                bc = tl.load(BETA + tok, mask=mt, other=0.0).to(tl.float32)
                u, w, decay, gcum = wy_chunk(kc, vc, gc, bc, BT)
                v_new = u - tl.dot(w, state, input_precision="ieee")
                intra = tl.dot(qc, tl.trans(kc), input_precision="ieee") * decay
                o = tl.dot(qc * tl.exp(gcum)[:, None], state, input_precision="ieee")
                o += tl.dot(intra, v_new, input_precision="ieee")
                tl.store(O + tok[:, None] * DV + cols[None, :], o, mask=mt[:, None] & mv[None, :])
                g_last = tl.sum(tl.where(rt == BT - 1, gcum, 0.0), axis=0)
                k_end = kc * tl.exp(g_last - gcum)[:, None]
                state = state * tl.exp(g_last) + tl.dot(tl.trans(k_end), v_new, input_precision="ieee")
            if jump >= 0:
                p_off = ((jump * H + h) * DK + rk[:, None]) * DK + rk[None, :]
                p = tl.load(P + p_off, mask=mk[:, None] & mk[None, :], other=0.0)
                b = tl.load(B + jump * (H * DK * DV) + kv_off, mask=kv_mask, other=0.0)
                if SAVES:  # flags: 1 = _FROM_SAVED, 2 = _SAVE
                    source = tl.where((flags & 1) != 0, saved, state)
                else:
                    source = state
                state = tl.dot(p, source, input_precision="ieee") + b
            if SAVES:
                if (flags & 2) != 0:
                    saved = state
        tl.store(STATE + kv_off, state, mask=kv_mask)


def _chunk_for(steps: list[tuple[int, int, int, int]], cap: int) -> int:
    """The chunk (16 .. cap) that streams the pieces cheapest: a chunk costs about its length in
    substitution steps plus a fixed share for its matmuls, and a piece pads to whole chunks."""
    lengths = [hi - lo for lo, hi, _, _ in steps if hi > lo]
    sizes = [c for c in (16, 32, 64, 128) if c <= cap]
    return min(sizes, key=lambda c: sum(-(-n // c) * (c + 16) for n in lengths))


def _scan_with_jumps_triton(q, k, v, g, beta, initial_state, jumps, steps, chunk_size):
    _, t, h, dk = k.shape
    dv = v.shape[-1]
    dev = q.device
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    out = torch.empty(1, t, h, dv, dtype=torch.float32, device=dev)
    state = torch.empty(1, h, dk, dv, dtype=torch.float32, device=dev)
    plan = torch.tensor(steps, dtype=torch.int64).to(dev)  # [steps, 4]: lo, hi, jump, flags; one copy
    s0 = initial_state.float().contiguous() if initial_state is not None else state
    if jumps is not None and jumps.at.numel():
        jumps = jumps.all_dense()  # the kernel reads every jump's operator from P and B
        p, b = jumps.p.contiguous(), jumps.b.contiguous()
    else:
        p, b = state, state  # never read: no step has a jump
    saves = any(f & _SAVE for *_, f in steps)
    bv = min(32, block_size(dv))
    grid = (h, triton.cdiv(dv, bv))
    _scan_kernel[grid](
        q, k, v, g, beta, s0, p, b, out, state, plan,
        len(steps), h, dk, dv, _chunk_for(steps, chunk_size), block_size(dk), bv, initial_state is not None, saves,
    )  # fmt: skip
    return out, state
