"""The one thread that drives the engine, fed by a bounded queue.

The engine is not thread-safe and a CPU (or one GPU) runs one forward at a time, so one worker owns it. It
schedules at the token, not the request: each turn it first admits every waiting request (up to
``max_active`` at once) and runs its prompt to the first token, then decodes one token of each admitted
request in turn. So a request that arrives while others are decoding waits for one decode step each, not for
whole answers, and requests that share documents all hit the segment cache whatever order they arrive in (the
first to be prefilled stores what the others then find). Decode steps are not batched into one forward: the
runtime's request states are single-sequence. ``max_active=1`` serves requests one after another, whole.

Each request is a ``Job``: its engine arguments, a cancel flag the HTTP side sets when the client goes away,
and the events (first token, text deltas, the finished output, or an error) handed back to the event loop.

``shadow_rate`` (0: off) picks that share of finished composed requests (every ``1 / rate``-th, counted
deterministically) to run again in ``full``, prompt only, once the worker is idle (nothing admitted, nothing
waiting): the KL of its next-token distribution to the served one goes to ``shadowed(job, kl)``. A shadow
runs after its request's answer has gone out and never writes the segment cache (``full`` reads none), so it
changes no answer and no request's TTFT; at most ``SHADOW_BACKLOG`` wait, the oldest dropped first.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..decoding import Generation
from ..engine import Engine
from ..fidelity import kl_divergence

FIRST, DELTA, DONE, ERROR = "first", "delta", "done", "error"
SHADOW_BACKLOG = 16


class QueueFull(Exception):
    """No room in the queue: the HTTP side answers 429."""


@dataclass
class Job:
    """One request on its way through the worker."""

    arguments: dict[str, Any]  # Engine.start_chat's: messages, tools, tool_choice, options (or ``method``'s)
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)
    started: float | None = None
    run: Generation | None = None
    method: str = "start_chat"  # the Engine method that begins it: start_chat, or start for a completion

    def emit(self, kind: str, payload: Any = None) -> None:
        """Hand an event to the request's coroutine, from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is gone: the server is shutting down
            self.cancelled.set()


class EngineWorker:
    """Runs ``Job``s on ``engine`` (see the module docstring); ``observe(job, output)`` is told of each finished
    one (the metrics)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_queue: int = 64,
        max_active: int = 8,
        queue_timeout_s: float = 120.0,
        observe: Callable[[Job, Any], None] | None = None,
        shadow_rate: float = 0.0,
        shadowed: Callable[[Job, float], None] | None = None,
    ) -> None:
        if max_queue < 1 or max_active < 1:
            raise ValueError("max_queue and max_active must be >= 1")
        if isinstance(shadow_rate, bool) or not isinstance(shadow_rate, (int, float)) or not 0 <= shadow_rate <= 1:
            raise ValueError(f"shadow_rate must be a number in [0, 1], got {shadow_rate!r}")
        self.shadow_rate, self.shadowed = float(shadow_rate), shadowed
        self._shadow_credit = 0.0
        self.shadows: deque[tuple[Job, Any]] = deque(maxlen=SHADOW_BACKLOG)
        self.engine = engine
        self.max_active, self.queue_timeout_s = max_active, queue_timeout_s
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.active: list[Job] = []
        self.observe = observe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hypic-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        for job in self.active:
            job.emit(ERROR, RuntimeError("the server is shutting down"))
        while not self.queue.empty():
            self.queue.get_nowait().emit(ERROR, RuntimeError("the server is shutting down"))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    # -- the thread -----------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit()
            for job in list(self.active):
                self._step(job)
            if self.shadows and not self.active and self.queue.empty():
                self._shadow(*self.shadows.popleft())

    def _sample_shadow(self, job: Job, output: Any) -> None:
        """Keep ``job`` for a shadow run if its turn has come (composed modes only: ``full`` is its own)."""
        mode = getattr(job.arguments.get("options"), "mode", None)
        if not self.shadow_rate or mode in (None, "full") or getattr(output, "prompt_logits", None) is None:
            return
        self._shadow_credit += self.shadow_rate
        if self._shadow_credit >= 1.0:
            self._shadow_credit -= 1.0
            self.shadows.append((job, output))

    def _shadow(self, job: Job, output: Any) -> None:
        """``job``'s prompt again in ``full``, to its first token; the KL to what was served, to ``shadowed``."""
        options = job.arguments["options"].replace(mode="full", max_new_tokens=1)
        try:
            run = getattr(self.engine, job.method)(**{**job.arguments, "options": options})
        except Exception:  # the request was served; a shadow that fails measures nothing
            return
        if self.shadowed is not None:
            self.shadowed(job, kl_divergence(run.prompt_logits, output.prompt_logits))

    def _admit(self) -> None:
        while len(self.active) < self.max_active:
            try:
                job = self.queue.get(timeout=0.05) if not self.active else self.queue.get_nowait()
            except queue.Empty:
                return
            if job.cancelled.is_set():
                continue
            waited = time.perf_counter() - job.enqueued
            if waited > self.queue_timeout_s:
                job.emit(ERROR, TimeoutError(f"waited {waited:.0f} s for the engine"))
                continue
            self._begin(job)

    def _begin(self, job: Job) -> None:
        job.started = time.perf_counter()
        try:
            job.run = getattr(self.engine, job.method)(
                **job.arguments,
                on_token=lambda _id, delta: job.emit(DELTA, delta) if delta else None,
                cancelled=job.cancelled.is_set,
            )
        except Exception as exc:  # ValueError: bad input (400); anything else: a bug (500)
            job.emit(ERROR, exc)
            return
        job.emit(FIRST, job.run)
        self.active.append(job)
        self._step(job)  # the first token goes out at once

    def _step(self, job: Job) -> None:
        assert job.run is not None
        try:
            done = job.run.step()
            output = job.run.output() if done else None
        except Exception as exc:
            self.active.remove(job)
            job.emit(ERROR, exc)
            return
        if done:
            self.active.remove(job)
            if self.observe is not None:
                self.observe(job, output)
            job.emit(DONE, output)
            self._sample_shadow(job, output)
