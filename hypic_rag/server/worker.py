"""The one thread that drives the engine, fed by a bounded queue: the server's loop over ``scheduler.Scheduler``.

The engine is not thread-safe and a CPU (or one GPU) runs one forward at a time, so one worker owns it and steps
the scheduler, which admits prompts first come first served a piece at a time under the token budget
(``max_num_batched_tokens``) and decodes every running request in one forward, up to ``max_active`` (its module
docstring has the policy). The queue in front is pulled only when the scheduler has room, so a full queue is a 429
and a request that waited past ``queue_timeout_s`` is answered with a timeout when its turn comes.
``max_active=1`` serves requests one after another, whole.

Each request is a ``Job``: its engine arguments, its ``request.Request`` (the status, the timestamps, the cancel
event the HTTP side sets when the client goes away), and the events (``status.Event``: first token, text deltas,
the finished output, or an error) handed back to the event loop, derived from the scheduler's in ``_notify``.

``shadow_rate`` (0: off) picks that share of finished composed requests (every ``1 / rate``-th, counted
deterministically) to run again in ``full``, prompt only, as a background request of the same scheduler, which
runs it once nothing else is in hand: the KL of its next-token distribution to the served one goes to
``shadowed(job, kl)``. A shadow runs after its request's answer has gone out and never writes the segment cache
(``full`` reads none), so it changes no answer and adds nothing to its own request's TTFT. It runs a piece a step,
and only in steps with nothing else to run, so a request that arrives meanwhile waits for one piece, not for the
whole shadow. At most ``SHADOW_BACKLOG`` wait, the oldest dropped first; a waiting shadow keeps its request's
prepared prompt and served logits, not its state.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..decoding import Generation, Prefilling
from ..defaults import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS, MAX_QUEUE, QUEUE_TIMEOUT_S
from ..engine import Engine
from ..fidelity import kl_divergence
from ..prepare import Prepared
from ..request import Request
from ..scheduler import Scheduler
from ..status import Event

log = logging.getLogger(__name__)
SHADOW_BACKLOG = 16


class QueueFull(Exception):
    """No room in the queue: the HTTP side answers 429."""


@dataclass
class Job:
    """One request on its way through the worker: what the HTTP side hands in and reads back. Its lifecycle
    (status, timestamps, cancel event) is its ``request``'s, which the worker begins once submitted."""

    prepared: Prepared  # ``Engine.prepare_chat``'s, or ``Engine.prepare``'s for a completion
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    request: Request = field(init=False)

    def __post_init__(self) -> None:
        self.request = Request(_unsubmitted, tag=self)

    def cancel(self) -> None:
        """The client has gone (or the request is done with): the scheduler drops it at its next step."""
        self.request.cancel()

    def emit(self, event: Event, payload: Any = None) -> None:
        """Hand an event to the request's coroutine, from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (event, payload))
        except RuntimeError:  # the loop is gone: the server is shutting down
            self.cancel()


def _unsubmitted(prefill_chunk: int) -> Generation | Prefilling:
    raise RuntimeError("the job was not submitted to a worker")


@dataclass(frozen=True)
class _Shadow:
    """A served request to run again in ``full``, and what it was served (its next-token logits)."""

    job: Job
    served: Any


class EngineWorker:
    """Runs ``Job``s on ``engine`` (see the module docstring); ``observe(job, output)`` is told of each finished
    one (the metrics)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_queue: int = MAX_QUEUE,
        max_active: int = MAX_ACTIVE,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
        observe: Callable[[Job, Any], None] | None = None,
        observe_step: Callable[[int, int], None] | None = None,
        shadow_rate: float = 0.0,
        shadowed: Callable[[Job, float], None] | None = None,
    ) -> None:
        """``observe(job, output)`` is told of each finished request, ``observe_step(running, tokens)`` of each
        step: the requests it decoded and the tokens it ran (their decode tokens and the prompts admitted)."""
        if max_queue < 1 or max_active < 1:
            raise ValueError("max_queue and max_active must be >= 1")
        if isinstance(shadow_rate, bool) or not isinstance(shadow_rate, (int, float)) or not 0 <= shadow_rate <= 1:
            raise ValueError(f"shadow_rate must be a number in [0, 1], got {shadow_rate!r}")
        self.shadow_rate, self.shadowed = float(shadow_rate), shadowed
        self._shadow_credit = 0.0
        self.engine = engine
        self.queue_timeout_s = queue_timeout_s
        self.scheduler = Scheduler(
            max_active=max_active,
            max_num_batched_tokens=max_num_batched_tokens,
            source=self._next,
            notify=self._notify,
            max_background=SHADOW_BACKLOG,
        )
        self.observe_step = observe_step
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.observe = observe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hypic-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def active(self) -> list[Job]:
        """The requests decoding (a shadow's is not a client's)."""
        return [r.tag for r in self.scheduler.running if isinstance(r.tag, Job)]

    @property
    def prefilling(self) -> Job | None:
        """The request whose prompt is running."""
        return self.scheduler.prefilling.tag if self.scheduler.prefilling is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        for request in self.scheduler.in_hand():
            if isinstance(request.tag, Job):
                request.tag.emit(Event.ERROR, RuntimeError("the server is shutting down"))
        while not self.queue.empty():
            self.queue.get_nowait().emit(Event.ERROR, RuntimeError("the server is shutting down"))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        job.request.begin = partial(self._begin, job)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    # -- the thread -----------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception as exc:  # a bug: the requests in hand fail with it (a 500), the worker goes on
                log.exception("engine worker step failed")
                self.scheduler.fail_all(exc)

    def _turn(self) -> None:
        report = self.scheduler.step()
        if report.decoded:
            _tell(self.observe_step, report.decoded, report.decoded + report.prefilled)

    def _sample_shadow(self, job: Job, output: Any) -> None:
        """Keep ``job`` for a shadow run if its turn has come (composed modes only: ``full`` is its own)."""
        mode = job.prepared.options.mode
        if not self.shadow_rate or mode == "full" or getattr(output, "prompt_logits", None) is None:
            return
        self._shadow_credit += self.shadow_rate
        if self._shadow_credit >= 1.0:
            self._shadow_credit -= 1.0
            shadow = _Shadow(job, output)
            self.scheduler.add(Request(partial(self._begin_shadow, shadow), tag=shadow), background=True)

    def _begin_shadow(self, shadow: _Shadow, prefill_chunk: int) -> Generation | Prefilling:
        options = shadow.job.prepared.options.replace(mode="full", max_new_tokens=1)
        return self.engine.begin(replace(shadow.job.prepared, options=options), prefill_chunk=prefill_chunk)

    def _next(self, wait: bool) -> Request | None:
        """The scheduler's source: the next waiting request still wanted, or None when there is none."""
        while True:
            try:
                job = self.queue.get(timeout=0.05) if wait else self.queue.get_nowait()
            except queue.Empty:
                return None
            if job.request.cancelled():
                continue
            waited = time.perf_counter() - job.request.arrival
            if waited > self.queue_timeout_s:
                job.emit(Event.ERROR, TimeoutError(f"waited {waited:.0f} s for the engine"))
                continue
            return job.request

    def _begin(self, job: Job, prefill_chunk: int) -> Generation | Prefilling:
        return self.engine.begin(  # prepared already; its cancel flag is the scheduler's to apply, decoding too
            job.prepared,
            on_token=lambda _id, delta: job.emit(Event.DELTA, delta) if delta else None,
            prefill_chunk=prefill_chunk,
        )

    def _notify(self, event: Event, request: Request) -> None:
        """The scheduler's news, as the request's wire events (the only place they are made, with ``DELTA``'s in
        ``_begin``): its first token with the started run, its answer, or its error. A request cancelled before its
        first token has no answer and nobody to tell. A shadow's answer is its KL to the one served."""
        if isinstance(request.tag, _Shadow):
            served = request.tag.served
            if event is Event.DONE and request.output is not None:
                kl = kl_divergence(request.output.prompt_logits, served.prompt_logits)
                _tell(self.shadowed, request.tag.job, kl)
            return
        job: Job = request.tag
        payload = {Event.FIRST: request.run, Event.DONE: request.output, Event.ERROR: request.error}[event]
        if payload is None:
            return
        if event is Event.DONE:
            _tell(self.observe, job, request.output)
        job.emit(event, payload)
        if event is Event.DONE:
            self._sample_shadow(job, request.output)


def _tell(callback: Callable[..., None] | None, *args: Any) -> None:
    """A metrics callback, whose failure is logged and never fails a request or stops the worker."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("a worker callback failed")
