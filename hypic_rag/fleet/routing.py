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
  takes a request only while its in-flight count is under ``ceil((1 + epsilon) * m / n)``, ``m`` the requests in
  flight counting this one; the best-placed replica that is under it wins. Affinity alone would send every
  request with a popular document to one replica; the bound keeps each within ``1 + epsilon`` of the mean at
  the price of a miss, and at least one replica (the least loaded) is always under it. The default slack is
  0.5: a replica batches its requests, so one with half again the mean in flight answers each little slower,
  while a tighter bound turns requests away from the replica that holds their documents (simulated over 8 and 32
  replicas, ``eval.bench.fleet_sim``, 0.25 kept 3 to 5 points of hit ratio fewer than 0.5).
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
EPSILON = 0.5  # the default slack over the mean in-flight count (module docstring)
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
    reason: str  # "affinity" (it holds some keys), "home", "least_loaded" (no key settles it), or a policy name
    believed: int = 0  # of the request's keys, those the first is believed to hold


class AffinityPolicy:
    """Segment affinity under a bounded load (see the module docstring)."""

    name = "affinity"

    def __init__(self, epsilon: float = EPSILON, routed_cap: int = ROUTED_CAP) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        self.epsilon, self.routed_cap = epsilon, routed_cap
        self.beliefs: dict[str, Belief] = {}

    def choose(self, replicas: Sequence[str], keys: Collection[str], load: Mapping[str, int], token: str) -> Choice:
        """Rank ``replicas`` for a request with segment ``keys`` (any order), given each one's in-flight
        ``load``; ``token`` (the request's id) breaks the ties that remain, the same way every time."""
        if not replicas:
            raise ValueError("no replicas to choose from")
        keys = sorted(set(keys))
        bound = load_bound(load, replicas, self.epsilon)
        homes = {r: 0 for r in replicas}
        for k in keys:
            homes[home(k, replicas)] += 1

        def score(r: str) -> tuple[int, int, int, int]:
            belief = self.beliefs.get(r)
            held = sum(belief.holds(k) for k in keys) if belief else 0
            return (held, homes[r], -load.get(r, 0), weight(token, r))

        scored = {r: score(r) for r in replicas}
        under = sorted((r for r in replicas if load.get(r, 0) < bound), key=scored.__getitem__, reverse=True)
        over = sorted((r for r in replicas if load.get(r, 0) >= bound), key=lambda r: (load.get(r, 0), r))
        best = scored[under[0]]
        reason = "affinity" if best[0] else "home" if best[1] else "least_loaded"
        return Choice(under + over, reason, best[0])

    def routed(self, replica: str, keys: Collection[str]) -> None:
        """``keys`` were sent to ``replica``: it holds them once it has answered."""
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


def make_policy(name: str, epsilon: float = EPSILON, seed: int = 0) -> Policy:
    if name == "affinity":
        return AffinityPolicy(epsilon)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "random":
        return RandomPolicy(seed)
    raise ValueError(f"unknown routing policy {name!r}; expected one of {', '.join(POLICIES)}")
