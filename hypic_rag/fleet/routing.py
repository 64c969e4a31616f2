"""Which replica of a fleet takes a request: the one expected to hold most of its segments, within a bounded load.

Written here rather than taken from Ray Serve: its routers rank replicas by queue length (power of two choices)
or, in ``ray.serve.llm``, by the longest cached *prefix* of the prompt's text, and a composed request's segments
come in any order, so neither sees what a replica can reuse. The policy is plain Python (no Ray), so its
invariants are tested with Hypothesis; ``router.py`` plugs it into Ray Serve.

- **What a replica holds** is believed, not asked per request: the keys of the requests routed to it (they are
  cached there once it has answered) and the keys its memory tier reported last (``EngineReplica`` reports them
  every ``request_routing_stats_period_s``). A report replaces the belief, so evictions reach the router; keys
  routed since the report before last are kept on top of it, as the report may predate them.
- **Where a key lives when no replica is believed to hold it** is its rendezvous home (highest random weight:
  Thaler & Ravishankar, "Using name-based mappings to increase hit rates", 1998): the replica with the highest
  ``hash(key, replica)``. Over a handful of replicas it needs no ring or virtual nodes, and a replica that comes
  or goes moves only the keys homed on it. The home count breaks ties between replicas believed to hold as many
  keys, so segments seen for the first time spread over the fleet by key, not by arrival.
- **Bounded load** (Mirrokni, Thorup & Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018): a replica
  takes a request only while its in-flight count is under ``ceil((1 + e) * m / n)``, ``m`` the requests in
  flight counting this one; the best-placed replica that is under it wins, and at least one replica (the least
  loaded) always is. Affinity alone would send every request with a popular document to one replica.
- **Two time scales.** A request that finds its documents costs a fraction of one that misses, so a replica
  serving hits clears a burst sooner than a replica it would be turned to, and a tight bound on a moment's
  in-flight count (a handful of requests on a small fleet) turns requests away often, each a miss that also
  pushes another replica's documents out. So the bound is tight (``e = epsilon``, 0.5 by default) only for a
  replica whose share of recent requests (decayed over ``HALF_LIFE`` decisions a replica) is above
  ``(1 + epsilon) / n``: a hot spot; every other replica may burst to ``1 + burst`` times the mean in flight
  (``BURST``, twice the mean, by default; ``burst = epsilon`` keeps every replica to the tight bound, which a
  fleet whose misses are cheap, a shared Redis on a small machine, may prefer: ``docs/benchmarks.md``).
  Simulated with clients that wait for their answers (``eval.bench.fleet_sim``'s closed loop, 2 and 4
  replicas): on clustered traffic the tight bound alone held 0.63 and 0.58 of documents against 0.74 and 0.63
  with both, and answered slower; the loose bound alone sent every request of one hot topic to one replica,
  twice the latency of both. Over 8 and 32 replicas a slack of 0.25 kept 3 to 5 points fewer than 0.5.
- A request with no cached segments (a short prompt, ``full`` or ``prefix`` mode) goes to the least loaded.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

POLICIES = ("affinity", "round_robin", "random")
EPSILON = 0.5  # the default slack over a replica's fair share, and its in-flight bound when above it (docstring)
BURST = 1.0  # the slack over the mean in-flight count of a replica within its share
HALF_LIFE = 32  # decisions a replica, over which a replica's share of recent requests halves
ROUTED_CAP = 4096  # keys remembered as routed to one replica (beyond its report), oldest dropped first


def weight(key: str, replica: str) -> int:
    """The rendezvous weight of ``replica`` for ``key`` (stable across processes and runs)."""
    return int.from_bytes(hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest(), "big")


def home(key: str, replicas: Collection[str]) -> str:
    """The replica a key lives on when none is believed to hold it."""
    return max(replicas, key=lambda r: weight(key, r))


def load_bound(load: Mapping[str, int], replicas: Collection[str], epsilon: float) -> int:
    """The in-flight count a replica must be under to take one more request."""
    m = sum(load.get(r, 0) for r in replicas) + 1
    return math.ceil((1 + epsilon) * m / len(replicas))


@dataclass
class Belief:
    """What one replica is believed to hold: its last report, and what was routed to it since the one before."""

    reported: frozenset[str] = frozenset()
    routed: OrderedDict[str, int] = field(default_factory=OrderedDict)  # key -> report generation routed in
    generation: int = 0

    def holds(self, key: str) -> bool:
        return key in self.reported or key in self.routed


@dataclass(frozen=True)
class Choice:
    """A ranking of replicas, best first, and why the first was chosen."""

    ranked: list[str]
    reason: str  # "affinity" (it holds most keys), "load_bound" (one holding more was over its bound), "home",
    # "least_loaded" (no key settles it), or a policy name
    believed: int = 0  # of the request's keys, those the first is believed to hold


class AffinityPolicy:
    """Segment affinity under a bounded load (see the module docstring)."""

    name = "affinity"

    def __init__(self, epsilon: float = EPSILON, routed_cap: int = ROUTED_CAP, burst: float = BURST) -> None:
        if not epsilon > 0 or not math.isfinite(epsilon):
            raise ValueError(f"epsilon must be a number > 0, got {epsilon}")
        if not burst > 0 or not math.isfinite(burst):
            raise ValueError(f"burst must be a number > 0, got {burst}")
        self.epsilon, self.routed_cap = epsilon, routed_cap
        self.burst = max(burst, epsilon)  # a burst bound tighter than the hot spot's would make no sense
        self.beliefs: dict[str, Belief] = {}
        self.recent: dict[str, float] = {}  # replica -> requests routed to it, decayed (``shares``)

    def shares(self, replicas: Collection[str]) -> dict[str, float]:
        """Each replica's share of the requests routed lately (all 0 before the first)."""
        total = sum(self.recent.get(r, 0.0) for r in replicas)
        return {r: self.recent.get(r, 0.0) / total if total else 0.0 for r in replicas}

    def bounds(self, load: Mapping[str, int], replicas: Collection[str]) -> dict[str, int]:
        """The in-flight count each replica must be under to take one more request (the module docstring)."""
        tight, loose = load_bound(load, replicas, self.epsilon), load_bound(load, replicas, self.burst)
        fair = (1 + self.epsilon) / len(replicas)
        return {r: tight if share > fair else loose for r, share in self.shares(replicas).items()}

    def choose(self, replicas: Sequence[str], keys: Collection[str], load: Mapping[str, int], token: str) -> Choice:
        """Rank ``replicas`` for a request with segment ``keys`` (any order), given each one's in-flight
        ``load``; ``token`` (the request's id) breaks the ties that remain, the same way every time."""
        if not replicas:
            raise ValueError("no replicas to choose from")
        keys = sorted(set(keys))
        bound = self.bounds(load, replicas)
        homes = {r: 0 for r in replicas}
        for k in keys:
            homes[home(k, replicas)] += 1

        def score(r: str) -> tuple[int, int, int, int]:
            belief = self.beliefs.get(r)
            held = sum(belief.holds(k) for k in keys) if belief else 0
            return (held, homes[r], -load.get(r, 0), weight(token, r))

        scored = {r: score(r) for r in replicas}
        under = sorted((r for r in replicas if load.get(r, 0) < bound[r]), key=scored.__getitem__, reverse=True)
        over = sorted((r for r in replicas if load.get(r, 0) >= bound[r]), key=lambda r: (load.get(r, 0), r))
        best = scored[under[0]]
        if max(held for held, *_ in scored.values()) > best[0]:
            reason = "load_bound"  # a replica holding more of them was over its bound
        else:
            reason = "affinity" if best[0] else "home" if best[1] else "least_loaded"
        return Choice(under + over, reason, best[0])

    def routed(self, replica: str, keys: Collection[str]) -> None:
        """``keys`` were sent to ``replica``: it holds them once it has answered."""
        decay = 0.5 ** (1 / (HALF_LIFE * max(1, len(self.recent))))
        for r in self.recent:
            self.recent[r] *= decay
        self.recent[replica] = self.recent.get(replica, 0.0) + 1
        belief = self.beliefs.setdefault(replica, Belief())
        for k in keys:
            belief.routed[k] = belief.generation
            belief.routed.move_to_end(k)
        while len(belief.routed) > self.routed_cap:
            belief.routed.popitem(last=False)

    def report(self, replica: str, keys: Collection[str]) -> None:
        """``replica``'s memory tier holds exactly ``keys`` (as of a moment ago)."""
        belief = self.beliefs.setdefault(replica, Belief())
        belief.reported = frozenset(keys)
        belief.generation += 1
        for k in [k for k, g in belief.routed.items() if g < belief.generation - 1]:
            del belief.routed[k]

    def forget(self, replica: str) -> None:
        """``replica`` is gone: what it held goes with it (its keys fall back to their homes among the rest)."""
        self.beliefs.pop(replica, None)
        self.recent.pop(replica, None)

    def believed(self, replica: str) -> int:
        belief = self.beliefs.get(replica)
        return len(belief.reported | set(belief.routed)) if belief else 0


class RoundRobinPolicy:
    """Each replica in turn, whatever the request holds: the baseline a plain load balancer gives."""

    name = "round_robin"

    def __init__(self) -> None:
        self.turn = 0

    def choose(self, replicas: Sequence[str], keys: Collection[str], load: Mapping[str, int], token: str) -> Choice:
        if not replicas:
            raise ValueError("no replicas to choose from")
        order = sorted(replicas)
        start = self.turn % len(order)
        self.turn += 1
        return Choice(order[start:] + order[:start], self.name)

    def routed(self, replica: str, keys: Collection[str]) -> None: ...

    def report(self, replica: str, keys: Collection[str]) -> None: ...

    def forget(self, replica: str) -> None: ...

    def believed(self, replica: str) -> int:
        return 0


class RandomPolicy(RoundRobinPolicy):
    """A replica drawn at random (seeded, so a benchmark's runs draw alike)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def choose(self, replicas: Sequence[str], keys: Collection[str], load: Mapping[str, int], token: str) -> Choice:
        if not replicas:
            raise ValueError("no replicas to choose from")
        order = sorted(replicas)
        self.rng.shuffle(order)
        return Choice(order, self.name)


Policy = AffinityPolicy | RoundRobinPolicy | RandomPolicy


def make_policy(name: str, epsilon: float = EPSILON, seed: int = 0, burst: float = BURST) -> Policy:
    if name == "affinity":
        return AffinityPolicy(epsilon, burst=burst)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "random":
        return RandomPolicy(seed)
    raise ValueError(f"unknown routing policy {name!r}; expected one of {', '.join(POLICIES)}")
