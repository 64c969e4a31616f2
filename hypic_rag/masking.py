"""A grammar's packed mask applied to logits rows: every forbidden token to -inf and its probability handed to its
longest allowed prefix (``grammar`` says why), with no pass over the whole row that the result does not need.

llguidance gives a mask as packed 32-bit words (bit ``i % 32`` of word ``i // 32``). What a mask does to a row is
a ``Plan``: its small side listed (the forbidden tokens inside a JSON string, where nearly all are allowed; the
allowed ones elsewhere) and the forbidden tokens that have an allowed prefix, grouped by that heir. A plan
depends on the mask alone, and a grammar's masks recur (each step inside a string has the same one), so a
tokenizer's ``Plans`` keeps them by the mask's listed words.

The rows come out as logits, not log-probabilities: the sampler's softmax is shift-invariant and a group's mass
is a log-sum-exp of its own logits, so the normaliser, a pass over the whole row, is left out. A CPU row is
written with numpy's index operations, whose call costs a microsecond where torch's cost several: the whole
mask should cost about what llguidance's own does. Rows on a device take torch, a whole batch in one set of
operations.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

LANES = np.arange(32, dtype=np.int32)
PLANS_KEPT = 256  # a tokenizer's plans: the distinct masks in flight at once, with room to spare


def words_for(vocab: int) -> int:
    """The packed words of a mask over ``vocab`` tokens."""
    return (vocab + 31) // 32


def pack(ids: Sequence[int], vocab: int) -> np.ndarray:
    """``ids`` as packed words."""
    bits = np.zeros(words_for(vocab) * 32, dtype=bool)
    bits[list(ids)] = True
    return np.packbits(bits, bitorder="little").view(np.int32).copy()


def unpack(words: np.ndarray, vocab: int) -> np.ndarray:
    """The packed ``words`` as a bool row of ``vocab``."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab].astype(bool)


def bits_at(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of ``ids`` (any shape, each below the words' reach) is set in ``words``."""
    return ((words[ids >> 5] >> (ids & 31).astype(np.int32)) & 1).astype(bool)


def _listed(words: np.ndarray, at: np.ndarray, vocab: int, allowed: bool) -> np.ndarray:
    """The ids below ``vocab`` set (``allowed``) or clear in the words at ``at``."""
    bits = ((words[at][:, None] >> LANES) & 1).astype(bool)
    ids = (at[:, None].astype(np.int64) * 32 + LANES)[bits if allowed else ~bits]
    return ids[ids < vocab]


@dataclass(frozen=True)
class Plan:
    """What one mask does to a row. ``keeps``: ``listed`` are the allowed ids and all else is cut; else they are
    the forbidden ones. ``movers`` (forbidden, with an allowed prefix) are sorted by heir; group ``g`` runs from
    ``starts[g]`` and hands its probability to ``heirs[g]``; ``group``: each mover's ``g``. ``vocab``: the
    tokenizer's size, past which a padded row is cut."""

    vocab: int
    listed: np.ndarray
    keeps: bool
    movers: np.ndarray
    starts: np.ndarray
    heirs: np.ndarray
    group: np.ndarray


class Plans:
    """One tokenizer's plans, the latest ``PLANS_KEPT`` kept. ``prefixes`` ``[vocab, depth]``: each token's
    proper prefixes that are tokens, longest first, -1 past the last; ``descendants(ids)``: the tokens with one of
    ``ids`` among their prefixes."""

    def __init__(self, vocab: int, prefixes: np.ndarray, descendants: Callable[[np.ndarray], np.ndarray]) -> None:
        self.vocab, self.prefixes, self.descendants = vocab, prefixes, descendants
        self._kept: OrderedDict[tuple[bool, bytes, bytes], Plan] = OrderedDict()
        self._lock = threading.Lock()  # masks are planned on the worker thread and on the caller's

    def of(self, words: np.ndarray) -> Plan:
        """The plan of the mask ``words``."""
        at = np.flatnonzero(words != -1)  # the words with a forbidden token: few inside a string
        keeps = at.size * 2 > words.size and np.count_nonzero(words) * 2 <= words.size
        if keeps:
            at = np.flatnonzero(words)
        key = (keeps, at.tobytes(), words[at].tobytes())
        plan = self._kept.get(key)  # a read needs no lock: one dict operation is atomic
        if plan is None:
            plan = self._made(words, at, keeps)
            with self._lock:
                self._kept[key] = plan
                if len(self._kept) > PLANS_KEPT:
                    self._kept.popitem(last=False)
        return plan

    def _made(self, words: np.ndarray, at: np.ndarray, keeps: bool) -> Plan:
        listed = _listed(words, at, self.vocab, allowed=keeps)
        if keeps:  # only a descendant of an allowed token can have an allowed prefix
            candidates = self.descendants(listed)
            candidates = candidates[~bits_at(words, candidates)]
        else:
            candidates = listed
        chains = self.prefixes[candidates]
        ok = (chains >= 0) & bits_at(words, np.maximum(chains, 0))
        has = ok.any(axis=1)
        heir = chains[np.arange(len(chains)), ok.argmax(axis=1)][has].astype(np.int64)  # the first: the longest
        order = np.argsort(heir, kind="stable")
        heir, movers = heir[order], candidates[has][order]
        heirs, starts, group = np.unique(heir, return_index=True, return_inverse=True)
        return Plan(self.vocab, listed, keeps, movers, starts, heirs, group)


def apply_row(row: np.ndarray, plan: Plan) -> None:
    """``plan`` written into a float32 CPU ``row`` (as wide as the vocabulary or padded past it)."""
    moved = row[plan.movers]
    if plan.keeps:
        kept = row[plan.listed]
        row.fill(-np.inf)
        row[plan.listed] = kept
    else:
        row[plan.listed] = -np.inf
        row[plan.vocab :] = -np.inf  # a model vocabulary padded past the tokenizer's: never allowed
    if plan.heirs.size:  # each group's log-sum-exp, shifted by its own largest: no group underflows
        top = np.maximum.reduceat(moved, plan.starts)
        top[~np.isfinite(top)] = 0.0
        mass = np.add.reduceat(np.exp(moved - top[plan.group]), plan.starts)
        with np.errstate(divide="ignore"):  # a group of -inf logits has no mass
            row[plan.heirs] = np.logaddexp(row[plan.heirs], np.log(mass) + top)


def apply_rows(logits: torch.Tensor, plans: Sequence[Plan | None]) -> None:
    """Each row of ``logits`` ``[B, L]`` (float, any device) under its plan (None: left alone), in one set of
    operations for the batch: the ids of every row offset into the flat tensor and sent over once."""
    width = logits.shape[1]
    rows = [(b, p) for b, p in enumerate(plans) if p is not None]
    if not rows:
        return
    flat = logits.view(-1)

    def ids(parts: list[np.ndarray]) -> torch.Tensor:
        joined = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return torch.from_numpy(joined.astype(np.int64)).to(logits.device)

    movers = ids([p.movers + b * width for b, p in rows])
    heirs = ids([p.heirs + b * width for b, p in rows])
    groups, first = [], 0
    for _, p in rows:  # each mover's group, numbered across the batch
        groups.append(p.group + first)
        first += p.heirs.size
    group = ids(groups)
    kept_at = ids([p.listed + b * width for b, p in rows if p.keeps])
    cut = ids(
        [p.listed + b * width for b, p in rows if not p.keeps]
        + [np.arange(p.vocab, width) + b * width for b, p in rows if not p.keeps]
    )
    moved, kept = flat[movers], flat[kept_at]
    flat[cut] = float("-inf")
    logits[[b for b, p in rows if p.keeps]] = float("-inf")
    flat[kept_at] = kept
    if heirs.numel():
        top = torch.full((heirs.numel(),), float("-inf"), dtype=flat.dtype, device=flat.device)
        top = top.scatter_reduce(0, group, moved, "amax")
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        mass = torch.zeros_like(top).index_add_(0, group, (moved - top[group]).exp())
        flat[heirs] = torch.logaddexp(flat[heirs], mass.log() + top)
