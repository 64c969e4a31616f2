"""Concurrent in-process callers of one engine, decoded together: the batched path for threads (LangChain's
``batch``/``abatch`` and streams, LlamaIndex's concurrent ``achat`` calls and streams) as the server's worker is
for HTTP requests. Both
drive the same ``scheduler.Scheduler``: admission, ``max_active``, the token budget, chunked prefill, cancellation
and failures are its, and this module only hands requests in and answers out.

The engine is not thread-safe, so no two forwards may overlap; instead of a lock held per request, callers
hand their request to a ``SharedBatch`` and the first one to find nobody driving it becomes the driver: it steps
the scheduler until its own answer is done, while the other callers wait for theirs; then a caller still waiting
takes over. No thread of its own, so nothing outlives the callers. ``lock`` is held for each step, so a caller
that needs the engine to itself (a cache fill ahead of requests) takes it and runs between two steps. A stream is
an ordinary request of the batch whose tokens its callback hands out as each step makes them.

A caller that gives up (its ``cancelled()`` says so, it is interrupted, or the ``await`` of an ``in_thread`` given
its ``cancel`` event is cancelled) takes its request out of the batch at the next step, in whatever state it is.

Async callers need a thread each while they wait, and asyncio's default executor holds only
``min(32, cores + 4)`` threads (six on two cores), which would cap how many concurrent ``await``s share a step:
``in_thread`` runs them on a pool as wide as ``ASYNC_CALLERS``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import TypeVar
from weakref import WeakKeyDictionary

from .decoding import Generation, Prefilling
from .engine import Engine
from .outputs import GenerationOutput
from .request import Request
from .scheduler import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS, Scheduler
from .status import Event, Status

T = TypeVar("T")

# Concurrent async calls that can wait on a shared batch at once; more queue for a thread.
ASYNC_CALLERS = 256
_ASYNC_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """A forked child inherits the pool's bookkeeping but not its threads: it starts a pool of its own."""
    global _ASYNC_POOL, _POOL_LOCK
    _ASYNC_POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


async def in_thread(fn: Callable[..., T], *args: object, cancel: threading.Event | None = None) -> T:
    """``asyncio.to_thread`` on a pool of ``ASYNC_CALLERS`` threads (the module docstring says why); the
    caller's context variables go with it, as with ``to_thread``. A thread cannot be stopped, so when the ``await``
    is cancelled, ``cancel`` is set for ``fn`` to see (``SharedBatch.run``'s ``cancelled``)."""
    global _ASYNC_POOL
    with _POOL_LOCK:
        if _ASYNC_POOL is None:  # threads are made as calls need them, and idle ones wait on a queue
            _ASYNC_POOL = ThreadPoolExecutor(ASYNC_CALLERS, thread_name_prefix="hypic-async")
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    try:
        return await asyncio.get_running_loop().run_in_executor(_ASYNC_POOL, call)
    except asyncio.CancelledError:
        if cancel is not None:
            cancel.set()
        raise


class SharedBatch:
    """Requests of many threads on one engine, decoded together on one scheduler (see the module docstring)."""

    def __init__(self, *, max_active: int = MAX_ACTIVE, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS) -> None:
        self.lock = threading.Lock()  # the engine's: held for each step of the batch
        self._cond = threading.Condition()  # guards the waiting list and the driver flag
        self._waiting: deque[Request] = deque()  # handed in, not yet taken by the scheduler
        self._driving = False
        self.scheduler = Scheduler(
            max_active=max_active, max_num_batched_tokens=max_num_batched_tokens, source=self._take, notify=self._ended
        )

    def run(
        self, start: Callable[..., Generation | Prefilling], cancelled: Callable[[], bool] | None = None
    ) -> GenerationOutput:
        """``start(prefill_chunk=n)`` (``Engine.start_chat``, ``Engine.start`` with their other arguments bound)
        decoded to the end among whatever else is running; its output, as it decodes alone up to the rounding of a
        batched matmul. ``start``'s errors are raised here. ``cancelled()`` says the caller gave up: a request
        decoding ends with ``finish_reason="cancelled"``, one not yet decoding raises ``CancelledError``.

        A caller drives the batch only until its own request is done, then hands the driving to a caller still
        waiting, so no caller is held past its answer; a caller interrupted (an exception out of a step, a
        KeyboardInterrupt) leaves the batch to the next one and takes its request out of it."""
        request = Request(start, cancelled, tag=threading.Event())
        with self._cond:
            self._waiting.append(request)
        try:
            self._wait_or_drive(request)
        except BaseException:
            request.cancel()  # the scheduler takes it out at its next step
            raise
        if request.output is not None:
            return request.output
        if request.status is Status.CANCELLED:
            raise CancelledError("the request was cancelled before its first token")
        assert request.error is not None
        raise request.error

    def _wait_or_drive(self, request: Request) -> None:
        done: threading.Event = request.tag
        while True:
            with self._cond:
                while self._driving and not done.is_set():
                    self._cond.wait()
                if done.is_set():
                    return
                self._driving = True
            try:
                self._drive(done)
            finally:
                with self._cond:
                    self._driving = False
                    self._cond.notify_all()

    def _drive(self, done: threading.Event) -> None:
        while not done.is_set() or self._fills_alone():
            with self.lock:
                try:
                    self.scheduler.step(wait=False)
                except Exception as exc:  # a bug outside any one request: the requests in hand fail with it
                    self.scheduler.fail_all(exc)
                except BaseException as exc:  # interrupted mid-step: the state of those in hand is not whole
                    self.scheduler.fail_all(RuntimeError(f"the shared batch's step was interrupted ({exc!r})"))
                    raise
            with self._cond:
                self._cond.notify_all()  # callers whose answers are done return

    def _fills_alone(self) -> bool:
        """Only deferred fills are left, and no caller to drive them: the last one runs them before it returns."""
        scheduler = self.scheduler
        with self._cond:
            nobody = not scheduler.running and not scheduler.prompts and not self._waiting
            return nobody and bool(scheduler.fills)

    def _take(self, wait: bool) -> Request | None:
        """The scheduler's source: the oldest request handed in, pulled only when it has room."""
        with self._cond:
            return self._waiting.popleft() if self._waiting else None

    @staticmethod
    def _ended(event: Event, request: Request) -> None:
        if event is not Event.FIRST:
            request.tag.set()


_GUARD = threading.Lock()
_SHARED: WeakKeyDictionary[Engine, SharedBatch] = WeakKeyDictionary()


def shared_batch(engine: Engine) -> SharedBatch:
    """The one ``SharedBatch`` of ``engine`` in this process."""
    with _GUARD:
        return _SHARED.setdefault(engine, SharedBatch())


def alone(engine: Engine, work: Callable[[], T]) -> T:
    """``work()`` with ``engine`` to itself (a cache fill), between two steps of its shared batch."""
    with shared_batch(engine).lock:
        return work()
