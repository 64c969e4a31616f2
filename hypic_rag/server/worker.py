"""The one thread that drives the engine, fed by a bounded queue: a continuous-batching scheduler.

The engine is not thread-safe and a CPU (or one GPU) runs one forward at a time, so one worker owns it. Each
step it first runs prompts, first come first served, then decodes one token of every running request in one
forward (``decoding.step_together``). A prompt runs in chunks of at most ``max_num_batched_tokens`` tokens
(``Engine.start(prefill_chunk=...)``: in-context tokens cut at that size, a composed prompt's cold segments one
a chunk), one prompt at a time; the step runs chunks while its budget (``max_num_batched_tokens``, less a token
for each running request's decode) lasts, and always one, so a long cold prompt holds the others' next token
back by one chunk, not by its whole prefill. A request whose prompt is in joins the running batch, up to
``max_active``. A request joins the batch at
any step and leaves it at the step it finishes or is cancelled; requests that share documents all hit the
segment cache whatever order they arrive in (the first to be prefilled stores what the others find).
``max_active=1`` serves requests one after another, whole.

Each request is a ``Job``: its engine arguments, a cancel flag the HTTP side sets when the client goes away,
and the events (first token, text deltas, the finished output, or an error) handed back to the event loop.

``shadow_rate`` (0: off) picks that share of finished composed requests (every ``1 / rate``-th, counted
deterministically) to run again in ``full``, prompt only, once the worker is idle (nothing running, nothing
waiting): the KL of its next-token distribution to the served one goes to ``shadowed(job, kl)``. A shadow
runs after its request's answer has gone out and never writes the segment cache (``full`` reads none), so it
changes no answer and adds nothing to its own request's TTFT. It runs a chunk (``max_num_batched_tokens``) a
step, and only in steps with nothing else to do, so a request that arrives meanwhile waits for one chunk, not
for the whole shadow. At most ``SHADOW_BACKLOG`` wait, the oldest dropped first; a waiting shadow keeps its
request's arguments and served logits, not its state.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..decoding import Decoder, Generation, Prefilling, step_together
from ..engine import Engine
from ..fidelity import kl_divergence

FIRST, DELTA, DONE, ERROR = "first", "delta", "done", "error"
log = logging.getLogger(__name__)
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
    pending: Prefilling | None = None  # its prompt, while it runs a chunk a step
    prefilled_tokens: int = 0  # prompt tokens its prefill ran through the model (the token budget's count)
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
        max_active: int = 16,
        max_num_batched_tokens: int = 2048,
        queue_timeout_s: float = 120.0,
        observe: Callable[[Job, Any], None] | None = None,
        observe_step: Callable[[int, int], None] | None = None,
        shadow_rate: float = 0.0,
        shadowed: Callable[[Job, float], None] | None = None,
    ) -> None:
        """``observe(job, output)`` is told of each finished request, ``observe_step(running, tokens)`` of each
        step: the requests it decoded and the tokens it ran (their decode tokens and the prompts admitted)."""
        if max_queue < 1 or max_active < 1:
            raise ValueError("max_queue and max_active must be >= 1")
        if max_num_batched_tokens < max_active:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be at least max_active ({max_active}):"
                " each running request takes a token of every step"
            )
        if isinstance(shadow_rate, bool) or not isinstance(shadow_rate, (int, float)) or not 0 <= shadow_rate <= 1:
            raise ValueError(f"shadow_rate must be a number in [0, 1], got {shadow_rate!r}")
        self.shadow_rate, self.shadowed = float(shadow_rate), shadowed
        self._shadow_credit = 0.0
        self.shadows: deque[tuple[Job, Any]] = deque(maxlen=SHADOW_BACKLOG)
        self.shadowing: tuple[Job, Any, Prefilling] | None = None  # the shadow whose prompt is running
        self.engine = engine
        self.max_active, self.queue_timeout_s = max_active, queue_timeout_s
        self.max_num_batched_tokens = max_num_batched_tokens
        self.observe_step = observe_step
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.active: list[Job] = []
        self.prefilling: Job | None = None  # the one request whose prompt is running, a chunk a step
        self.observe = observe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hypic-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        for job in [*self.active, *([self.prefilling] if self.prefilling is not None else [])]:
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
            try:
                self._turn()
            except Exception as exc:  # a bug: the requests in hand fail with it (a 500), the worker goes on
                log.exception("engine worker step failed")
                for job in [*self.active, *([self.prefilling] if self.prefilling is not None else [])]:
                    job.emit(ERROR, exc)
                self.active.clear()
                self.prefilling = None

    def _turn(self) -> None:
        prefilled = self._admit()
        if self.active:
            running = len(self.active)
            self._step_all()
            _tell(self.observe_step, running, running + prefilled)
        if (self.shadows or self.shadowing) and not self.active and self.prefilling is None and self.queue.empty():
            self._shadow_step()

    def _sample_shadow(self, job: Job, output: Any) -> None:
        """Keep ``job`` for a shadow run if its turn has come (composed modes only: ``full`` is its own)."""
        mode = getattr(job.arguments.get("options"), "mode", None)
        if not self.shadow_rate or mode in (None, "full") or getattr(output, "prompt_logits", None) is None:
            return
        self._shadow_credit += self.shadow_rate
        if self._shadow_credit >= 1.0:
            self._shadow_credit -= 1.0
            self.shadows.append((job, output))

    def _shadow_step(self) -> None:
        """One chunk of the running shadow (the oldest waiting one, begun here, if none runs): its request's
        prompt again in ``full``; once it is in, the KL to what was served goes to ``shadowed``."""
        if self.shadowing is None:
            job, output = self.shadows.popleft()
            options = job.arguments["options"].replace(mode="full", max_new_tokens=1)
            try:
                pending = getattr(self.engine, job.method)(
                    **{**job.arguments, "options": options}, prefill_chunk=self.max_num_batched_tokens
                )
            except Exception:  # the request was served; a shadow that fails measures nothing
                return
            self.shadowing = (job, output, pending)
        job, output, pending = self.shadowing
        try:
            pending.advance()
        except Exception:
            self.shadowing = None
            return
        if pending.generation is not None:
            self.shadowing = None
            _tell(self.shadowed, job, kl_divergence(pending.generation.prompt_logits, output.prompt_logits))

    def _admit(self) -> int:
        """Run prompts, first come first served, a chunk at a time, while the step's budget lasts (always one
        chunk); the prompt tokens they ran. A request whose prompt is in joins the running batch."""
        budget = self.max_num_batched_tokens - len(self.active)
        used = 0
        while len(self.active) < self.max_active and (used == 0 or used < budget):
            if self.prefilling is None:
                job = self._next(wait=not self.active and used == 0 and self.shadowing is None)
                if job is None:
                    break
                if not self._begin(job):
                    continue
            used += self._advance()
        return used

    def _next(self, wait: bool) -> Job | None:
        """The next waiting request still wanted, or None when there is none."""
        while True:
            try:
                job = self.queue.get(timeout=0.05) if wait else self.queue.get_nowait()
            except queue.Empty:
                return None
            if job.cancelled.is_set():
                continue
            waited = time.perf_counter() - job.enqueued
            if waited > self.queue_timeout_s:
                job.emit(ERROR, TimeoutError(f"waited {waited:.0f} s for the engine"))
                continue
            return job

    def _begin(self, job: Job) -> bool:
        job.started = time.perf_counter()
        try:
            job.pending = getattr(self.engine, job.method)(
                **job.arguments,
                on_token=lambda _id, delta: job.emit(DELTA, delta) if delta else None,
                cancelled=job.cancelled.is_set,
                prefill_chunk=self.max_num_batched_tokens,
            )
        except Exception as exc:  # ValueError: bad input (400); anything else: a bug (500)
            job.emit(ERROR, exc)
            return False
        self.prefilling = job
        return True

    def _advance(self) -> int:
        """One chunk of the prompt running; the tokens it ran. A cancelled request's prompt stops here."""
        job = self.prefilling
        assert job is not None and job.pending is not None
        if job.cancelled.is_set():
            self.prefilling = None
            return 0
        try:
            ran = job.pending.advance()
        except Exception as exc:
            self.prefilling = None
            job.emit(ERROR, exc)
            return 0
        job.prefilled_tokens += ran
        if job.pending.generation is not None:
            self.prefilling = None
            job.run = job.pending.generation
            job.emit(FIRST, job.run)
            try:
                job.run.decoder.take_now()  # the first token goes out at once, not after the others' prompts
            except Exception as exc:
                job.emit(ERROR, exc)
                return ran
            self.active.append(job)
        return ran

    def _step_all(self) -> None:
        """One token of every running request, in one forward; finished, cancelled and failed ones leave."""
        jobs = {id(job.run.decoder): job for job in self.active if job.run is not None}
        failures: dict[int, Exception] = {}

        def failed(decoder: Decoder, exc: Exception) -> None:
            failures[id(decoder)] = exc

        try:
            done = step_together([job.run.decoder for job in self.active if job.run is not None], failed)
        except Exception as exc:  # the batch's forward itself: every request in it fails
            for job in self.active:
                job.emit(ERROR, exc)
            self.active.clear()
            return
        for key, finished in zip(list(jobs), done, strict=True):
            job = jobs[key]
            if key in failures:
                self.active.remove(job)
                job.emit(ERROR, failures[key])
            elif finished:
                self._finish(job)

    def _finish(self, job: Job) -> None:
        assert job.run is not None
        self.active.remove(job)
        try:
            output = job.run.output()
        except Exception as exc:
            job.emit(ERROR, exc)
            return
        job.run = job.pending = None  # its state (KV, linear states) is no longer needed, shadowed or not
        _tell(self.observe, job, output)
        job.emit(DONE, output)
        self._sample_shadow(job, output)


def _tell(callback: Callable[..., None] | None, *args: Any) -> None:
    """A metrics callback, whose failure is logged and never fails a request or stops the worker."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("a worker callback failed")
