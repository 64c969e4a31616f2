"""Kept request states, restored at any token position: exact prefix caching, and a conversation's turns.

A node is the state a request had after the first ``seq_len`` tokens of its prompt (and answer): the KV of the
tokens since its parent node, whose key it names, so a chain of nodes holds a conversation's KV with each token's
once, and, held apart under the same key, the linear states there. A restore needs the whole chain's KV and the
point's own linear states; a conversation's old points lose their linear states first (they are most of the
bytes), which leaves the chain whole for its newest ones. Its key hashes the model's fingerprint, a namespace and those
token ids. The namespace says how the state was computed: ``exact`` (``EXACT``) for states run in context
(``prefix`` mode's, and a composed request's that composed nothing), a composed request's own (its seam and
variant, ``composed_namespace``) for the states it actually used, so that ``prefix`` mode, which reads only
``exact``, still equals ``full``. A request restores the longest node whose tokens begin its prompt, in the
namespaces it may read, and whose chain is whole.

A stretch of a chain can also be found again later in a prompt (``find_run``): a document inserted into (or removed
from) a conversation's history leaves the turns after it as they were, each node's tokens since its parent
(its *edge*) still in order. Nodes are indexed by their edge's first ``RUN_PROBE`` tokens and by parent, so a
composed request looks a run up at each of its segments' starts (``runs``, docs/design.md §6).

Hand-written: the engines that cache hybrid states (vLLM, SGLang) keep them per block of their own paged memory;
ours are request states, restored into a fresh ``RequestState``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..model.state import AttentionLayerKV, LinearLayerState, RequestState, StateMarks
from .lru import ByteLRU, Space, memory_space

EXACT = "exact"
POINT = "point:"  # a node's linear states are held under its key with this before it
RUN_PROBE = 8  # a run is looked up by its first edge's first tokens; a shorter edge starts none
RUN_SEARCH = 256  # the most nodes one run lookup visits: a prompt bounds the work it causes


def composed_namespace(seam: object, variant: str) -> str:
    """Where a composed request keeps its states: the settings that made them (``pic`` is a seam of 0)."""
    return f"composed/{seam}/{variant}"


@dataclass
class PrefixNode:
    seq_len: int
    parent: str | None  # the node its KV continues (None: the prompt's start)
    kv: dict[int, AttentionLayerKV]  # the tokens since its parent's end only
    saves: int = 0  # the longest restore it is part of: what its eviction would cost (``prefill_tokens``)
    edge: bytes = b""  # its token ids since its parent's end (int64): how a run finds it elsewhere in a prompt
    namespace: str = EXACT

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes for k in self.kv.values()) + len(self.edge)

    @property
    def edge_length(self) -> int:
        return len(self.edge) // 8

    @property
    def prefill_tokens(self) -> int:
        """The prefill it saves, for the memory tier's value policy: that of the longest chain it is part of, so
        that a chain's first nodes are not the first to go."""
        return max(self.seq_len, self.saves)


@dataclass
class PointState:
    """The linear states at a node: what makes it a point a request can restore."""

    seq_len: int
    linear: dict[int, LinearLayerState]

    @property
    def nbytes(self) -> int:
        return sum(s.conv.nbytes + s.recurrent.nbytes for s in self.linear.values())

    @property
    def prefill_tokens(self) -> int:
        return self.seq_len


@dataclass(frozen=True)
class Kept:
    """A node found or written: its key, how many tokens it covers, its namespace and its chain (root first)."""

    key: str
    length: int
    namespace: str
    chain: tuple[tuple[str, PrefixNode], ...] = field(default=(), repr=False, compare=False)  # (key, node)


@dataclass(frozen=True)
class Run:
    """A stretch of a kept chain found later in a prompt: its nodes (their edges tile ``length`` tokens from
    ``start`` in the prompt), where it began in the prompt that kept it (``first``), and the linear states at its
    end (``point``)."""

    start: int
    length: int
    first: int
    namespace: str
    chain: tuple[tuple[str, PrefixNode], ...] = field(repr=False, compare=False)
    point: PointState = field(repr=False, compare=False)

    def kv(self) -> dict[int, AttentionLayerKV]:
        """Its tokens' KV per attention layer, as the request that kept it held them (at its positions there)."""
        nodes = [node for _, node in self.chain]
        return _joined(nodes, nodes[-1].kv)


@dataclass
class Mark:
    """A state noted while a request runs (``PrefixStore.mark``), kept as a node once it ends."""

    ids: tuple[int, ...]
    namespace: str
    linear: dict[int, LinearLayerState]
    sizes: dict[int, int]  # per attention layer, the KV entries its buffer held then

    @property
    def length(self) -> int:
        return len(self.ids)


@dataclass
class Keeping:
    """What a request keeps once it ends: the state it restored (and the KV entries that came with it), then
    its marks, in order."""

    base: Kept | None
    sizes: dict[int, int]
    marks: list[Mark] = field(default_factory=list)


def _sizes(state: RequestState) -> dict[int, int]:
    return {i: layer.keys.shape[2] for i in state.attention_layer_ids if (layer := state.attention(i)) is not None}


def _linear(state: RequestState, copy: bool = False) -> dict[int, LinearLayerState]:
    out = {}
    for i in state.linear_layer_ids:
        layer = state.linear(i)
        if layer is not None:
            conv, recurrent = (layer.conv.clone(), layer.recurrent.clone()) if copy else (layer.conv, layer.recurrent)
            out[i] = LinearLayerState(conv, recurrent)
    return out


def _joined(nodes: Sequence[PrefixNode], layers: Sequence[int]) -> dict[int, AttentionLayerKV]:
    kv = {}
    for i in layers:
        parts = [n.kv[i] for n in nodes if i in n.kv]
        kv[i] = AttentionLayerKV(
            torch.cat([p.keys for p in parts], dim=2),
            torch.cat([p.values for p in parts], dim=2),
            torch.cat([p.positions for p in parts]),
            torch.cat([p.shift for p in parts]),
        )
    return kv


def _root(kept: Kept) -> str:
    return kept.chain[0][0] if kept.chain else kept.key


def _as_bytes(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype=np.int64).tobytes()


def _probe(namespace: str, edge: bytes) -> bytes:
    return namespace.encode() + b"\0" + edge[: 8 * RUN_PROBE]


def _within(part: np.ndarray, whole: np.ndarray) -> bool:
    """Whether ``whole`` is ``part`` with one stretch inserted (or none): a shared beginning, then the rest of
    ``part`` ending ``whole``. Two array comparisons, whatever the prompt's length."""
    if len(part) > len(whole):
        return False
    same = part == whole[: len(part)]
    n = len(part) if same.all() else int(same.argmin())  # the shared beginning
    rest = len(part) - n
    return bool((part[n:] == whole[len(whole) - rest :]).all()) if rest else True


def _tiled(path: Sequence[tuple[str, PrefixNode]]) -> int:
    """The tokens a path's edges tile (0 for none)."""
    return path[-1][1].seq_len - path[0][1].seq_len + path[0][1].edge_length if path else 0


class PrefixStore:
    """Kept states keyed by namespace and token ids, in a byte-budget memory tier."""

    def __init__(self, fingerprint: str, memory: ByteLRU | Space | int = 1 << 30) -> None:
        """``memory``: the engine's shared LRU (one budget for all its caches), or a budget of its own."""
        self.fingerprint = fingerprint
        # Nodes and their points in one space, so that the memory tier sees a conversation's as one value (``_put``).
        self._nodes: Space[PrefixNode | PointState] = memory_space(memory, "prefix")
        self._lengths: Counter[int] = Counter()  # the lengths nodes were kept at (evicted ones too, until a rebuild)
        # Runs' indexes, by namespace and an edge's first tokens, and by parent (evicted keys too, until a rebuild).
        self._starts: dict[bytes, set[str]] = {}
        self._children: dict[str, set[str]] = {}
        self._kept = 0

    def _hasher(self, namespace: str) -> hashlib._Hash:
        h = hashlib.sha256(self.fingerprint.encode())
        h.update(b"\0" + namespace.encode() + b"\0")
        return h

    def key(self, ids: Sequence[int], namespace: str = EXACT) -> str:
        h = self._hasher(namespace)
        h.update(_as_bytes(ids))
        return h.hexdigest()

    def _candidate_lengths(self, most: int) -> list[int]:
        self._recount()
        return sorted(n for n in self._lengths if 0 < n <= most)

    def _recount(self) -> None:
        """Evictions are not reported: once the indexes name many more nodes than are held, rebuild them."""
        if self._kept <= 2 * len(self._nodes) + 64:
            return
        self._lengths.clear()
        self._starts.clear()
        self._children.clear()
        for key, node in self._nodes.items():
            if isinstance(node, PrefixNode):
                self._index(key, node)
        self._kept = len(self._nodes)

    def _index(self, key: str, node: PrefixNode) -> None:
        self._lengths[node.seq_len] += 1
        if node.parent is not None:
            self._children.setdefault(node.parent, set()).add(key)
        if node.edge_length >= RUN_PROBE:
            self._starts.setdefault(_probe(node.namespace, node.edge), set()).add(key)

    def find(
        self, ids: Sequence[int], namespaces: Sequence[str] = (EXACT,), most: int | None = None, root_at: int = 0
    ) -> Kept | None:
        """The longest node (at most ``most`` tokens) whose tokens begin ``ids``, in one of ``namespaces`` (the
        earlier of them at equal length), with its whole chain held; None if there is none. Then the chain the
        request will start, at ``root_at`` tokens, counts as looked up, so the memory tier sees a prompt recur
        even while its nodes are not let in."""
        found = self._find(ids, namespaces, most)
        if found is None and 0 < root_at <= len(ids):
            for namespace in namespaces:
                self._nodes.note(self.key(ids[:root_at], namespace))
        return found

    def _find(self, ids: Sequence[int], namespaces: Sequence[str], most: int | None) -> Kept | None:
        lengths = self._candidate_lengths(len(ids) if most is None else min(most, len(ids)))
        if not lengths:
            return None
        data = _as_bytes(ids)
        keys: list[list[str]] = []
        for namespace in namespaces:
            h, at, found = self._hasher(namespace), 0, []
            for n in lengths:
                h.update(data[8 * at : 8 * n])
                at = n
                found.append(h.copy().hexdigest())
            keys.append(found)
        for k in range(len(lengths) - 1, -1, -1):
            for namespace, found in zip(namespaces, keys, strict=True):
                if POINT + found[k] not in self._nodes:
                    continue
                chain = self._chain(found[k])
                if chain is not None:
                    return Kept(found[k], lengths[k], namespace, chain)
        return None

    def _chain(self, key: str) -> tuple[tuple[str, PrefixNode], ...] | None:
        """The node under ``key`` and its ancestors, root first; None unless all are held."""
        nodes: list[tuple[str, PrefixNode]] = []
        at: str | None = key
        while at is not None:
            node = self._nodes.get(at, count=False)
            if not isinstance(node, PrefixNode):
                return None
            nodes.append((at, node))
            at = node.parent
        return tuple(reversed(nodes))

    def restore(self, kept: Kept, state: RequestState) -> None:
        """Load ``kept`` (as ``find`` returned it) into an empty request ``state``."""
        self._uses(kept, count=True)
        nodes = [node for _, node in kept.chain]
        last = nodes[-1]
        point = self._nodes.get(POINT + kept.key, _root(kept), count=False)
        assert isinstance(point, PointState), "restore takes a point find() returned"
        state.restore(last.seq_len, point.linear, _joined(nodes, list(last.kv)))

    def find_run(self, ids: Sequence[int], at: int, namespaces: Sequence[str], most: int) -> Run | None:
        """The longest run of kept nodes, in one of ``namespaces``, whose edges tile ``ids`` from ``at`` to at most
        ``most``, each node held and the last one with its point; None if there is none. A run's states carry what
        came before it where it was kept, so it is found only after its chain's start and where ``ids`` before
        ``at`` are all of that with one stretch inserted (nothing removed); and they never saw what was inserted,
        so only where that is no longer than the run."""
        if most - at < RUN_PROBE:
            return None
        # A request looks at every segment start: the prompt is converted only where an edge begins there.
        probe = _as_bytes(ids[at : at + RUN_PROBE])
        candidates = [k for namespace in namespaces for k in sorted(self._starts.get(_probe(namespace, probe), ()))]
        if not candidates:
            return None
        data = _as_bytes(ids[:most])
        before = np.asarray(ids[:at], dtype=np.int64)
        best: list[tuple[str, PrefixNode]] = []
        budget = [RUN_SEARCH]
        for key in candidates:
            node = self._held(key)
            if node is None or node.parent is None or not data.startswith(node.edge, 8 * at):
                continue
            context = self._context(node.parent)
            if context is None or not _within(context, before):
                continue
            path = self._longest([(key, node)], data, 8 * at + len(node.edge), budget)
            # its states forget what the prompt has before it that they never saw: at most the run's length
            if _tiled(path) > _tiled(best) and _tiled(path) >= at - len(context):
                best = path
        if not best:
            return None
        first = best[0][1]
        root = self._root_of(best[0][0])
        for key, _ in best:
            self._nodes.get(key, root, count=False)
        point = self._nodes.get(POINT + best[-1][0], root, count=False)
        assert isinstance(point, PointState)
        return Run(at, _tiled(best), first.seq_len - first.edge_length, first.namespace, tuple(best), point)

    def _context(self, key: str) -> np.ndarray | None:
        """The token ids up to the end of node ``key``, from its chain's edges; None unless the chain is held."""
        edges = []
        at: str | None = key
        while at is not None:
            node = self._held(at)
            if node is None:
                return None
            edges.append(node.edge)
            at = node.parent
        return np.frombuffer(b"".join(reversed(edges)), dtype=np.int64)

    def _held(self, key: str) -> PrefixNode | None:
        node = self._nodes.get(key, count=False)
        return node if isinstance(node, PrefixNode) else None

    def _longest(
        self, path: list[tuple[str, PrefixNode]], data: bytes, at: int, budget: list[int]
    ) -> list[tuple[str, PrefixNode]]:
        """The longest way on from ``path``'s last node through children whose edges ``data`` holds from byte
        ``at``, cut back to its last node with a point (empty if none); ``budget``: nodes it may still visit."""
        best = path if POINT + path[-1][0] in self._nodes else []
        for key in sorted(self._children.get(path[-1][0], ())):
            if budget[0] <= 0:
                break
            budget[0] -= 1
            node = self._held(key)
            if node is None or not node.edge or not data.startswith(node.edge, at):
                continue
            way = self._longest([*path, (key, node)], data, at + len(node.edge), budget)
            if _tiled(way) > _tiled(best):
                best = way
        return best

    def _root_of(self, key: str) -> str:
        """The first node of the chain ``key`` is on, as far as it is held: what its conversation is seen as."""
        at: str | None = key
        while at is not None and (node := self._held(at)) is not None:
            key, at = at, node.parent
        return key

    def _uses(self, kept: Kept, count: bool = False, since: int = 0, worth: int = 0) -> None:
        """A restore of ``kept`` (``count``: one lookup of its conversation), or a node kept after it, is a use of
        every node of its chain from ``since`` (those before it used already by the same request), each then worth
        what the whole chain saves (``worth``: the longer chain a request is about to keep after it)."""
        root = _root(kept)
        if count:
            self._nodes.note(root)
        worth = max(worth, kept.length)
        for key, node in kept.chain[since:]:
            node.saves = max(node.saves, worth)
            self._nodes.get(key, root, count=False)

    def begin(self, state: RequestState, base: Kept | None) -> Keeping:
        """What a request will keep, after ``base``, the state it restored into ``state`` (None: nothing)."""
        return Keeping(base, _sizes(state))

    def mark(self, keeping: Keeping, ids: Sequence[int], state: RequestState, namespace: str) -> None:
        """Note ``state``, which holds ``ids``, to be kept once the request ends: its linear states copied now,
        its KV cut from the request's buffers then (they only grow), so no KV is copied while the prompt runs."""
        if len(ids) != state.seq_len:
            raise ValueError(f"a state of {state.seq_len} tokens kept under {len(ids)} ids")
        self._note(keeping, Mark(tuple(ids), namespace, _linear(state, copy=True), _sizes(state)))

    def mark_within(
        self, keeping: Keeping, ids: Sequence[int], ran: int, marks: StateMarks, state: RequestState, namespace: str
    ) -> None:
        """Note the states a forward of the last ``ran`` tokens recorded at ``marks`` (``state``, after it, holds
        ``ids``): what ``mark`` would have noted had the forward been cut there."""
        if len(ids) != state.seq_len or not 0 < ran <= len(ids):
            raise ValueError(f"a forward of {ran} tokens ending at {state.seq_len} kept under {len(ids)} ids")
        start, sizes = len(ids) - ran, _sizes(state)
        for at, linear in zip(marks.at, marks.linear(state.linear_layer_ids), strict=True):
            before = {i: n - (ran - at) for i, n in sizes.items()}
            self._note(keeping, Mark(tuple(ids[: start + at]), namespace, linear, before))

    def _note(self, keeping: Keeping, mark: Mark) -> None:
        last = keeping.marks[-1].length if keeping.marks else keeping.base.length if keeping.base else 0
        if mark.length > last:
            keeping.marks.append(mark)

    def keep(self, keeping: Keeping, state: RequestState, ids: Sequence[int] | None = None) -> Kept | None:
        """Keep ``keeping``'s marks as nodes, each after the one before (the first after its base), cutting their KV
        from ``state``, the request's state once it ended; with ``ids`` (what it then holds), that state too, under
        the last mark's namespace. The last node kept (or found already kept)."""
        marks = list(keeping.marks)
        if ids is not None and marks and state.seq_len > marks[-1].length:
            marks.append(Mark(tuple(ids[: state.seq_len]), marks[-1].namespace, _linear(state), _sizes(state)))
        parent, sizes = keeping.base, keeping.sizes
        worth = marks[-1].length if marks else 0
        if parent is not None and marks:  # one use of the chain it continues, each node then worth the whole
            self._uses(parent, worth=worth)
        for mark in marks:
            parent, sizes = self._put(mark, state, parent, sizes, worth), mark.sizes
            if parent is None:
                return None  # refused: no node after it can be used
        return parent

    def _put(
        self, mark: Mark, state: RequestState, parent: Kept | None, start: dict[int, int], worth: int
    ) -> Kept | None:
        key = self.key(mark.ids, mark.namespace)
        chain = parent.chain if parent is not None else ()
        held = self._nodes.get(key, count=False)
        if isinstance(held, PrefixNode):
            if POINT + key not in self._nodes:
                self._nodes.put(POINT + key, PointState(mark.length, mark.linear), chain[0][0] if chain else key)
            return Kept(key, mark.length, mark.namespace, (*chain, (key, held)))
        kv = {}
        for i, end in mark.sizes.items():
            layer = state.attention(i)
            assert layer is not None
            a = start.get(i, 0)
            kv[i] = AttentionLayerKV(
                layer.keys[:, :, a:end].clone(),
                layer.values[:, :, a:end].clone(),
                layer.positions[a:end].clone(),
                layer.shift[a:end].clone(),
            )
        begins = parent.length if parent is not None else 0
        edge = _as_bytes(mark.ids[begins:])
        up = parent.key if parent is not None else None
        node = PrefixNode(mark.length, up, kv, mark.length, edge, mark.namespace)
        # A conversation is counted as one value, its root: its nodes and points are seen as it is, so a new turn's
        # may take the place of its own older ones, and competes with other entries as the conversation does.
        root = chain[0][0] if chain else key
        if parent is not None:  # its ancestors were used when the request's keeping began
            self._uses(parent, since=len(parent.chain) - 1, worth=worth)
        if not self._nodes.put(key, node, root):
            return None
        self._nodes.put(POINT + key, PointState(mark.length, mark.linear), root)  # if refused, the chain goes on
        self._index(key, node)
        self._kept += 1
        return Kept(key, mark.length, mark.namespace, (*chain, (key, node)))

    def clear(self) -> None:
        self._nodes.clear()
        self._lengths.clear()
        self._starts.clear()
        self._children.clear()
        self._kept = 0

    def stats(self) -> dict[str, int]:
        held = self._nodes.items()
        return {
            "prefix_nodes": sum(isinstance(v, PrefixNode) for _, v in held),
            "prefix_points": sum(isinstance(v, PointState) for _, v in held),
            "prefix_bytes": self._nodes.used,
        }
