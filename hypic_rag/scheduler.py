"""Continuous batching, written once: which requests run, how much of their prompts a step may run, and one token of
every running request per step.

Each ``step`` first runs prompt pieces (``decoding.Piece``: an in-context chunk, a cold segment's fill, a probe,
the fused seam and query forward, a deferred fill), each announced with its token cost before it runs, under one
token budget: ``max_num_batched_tokens`` less a token for each running request's decode (and one for the prompt's
own, should the piece finish it). The running requests' deferred fills go first, then the prompts running (up to
``MAX_PROMPTS`` at once), then the ones waiting, first come first served. A splittable piece is cut to what is
left; an atomic piece runs when it fits, or alone when nothing else has run in the step, so a step passes the
budget only by one atomic piece (``StepReport`` says what ran). A long cold prompt thus holds the others' next
token back by one piece, not by its whole prefill.

Several prompts run side by side: in their first step the prompts begun then go before those running already,
within half of what is left of the budget together (an atomic piece over its share waits for its turn), and
after that the one that went first in a step goes last in the next (round robin). So a short prompt that
arrives behind a long one is in at the long one's next step instead of after its whole prefill; newcomers take
half of a step at most, and the rest goes round robin among the prompts running before, so each of those runs a
piece at least every ``MAX_PROMPTS`` steps: no prompt starves, and prompts begin in the order they came. Round
robin rather than shortest first, since a prompt's cost is known only a piece at a time (a composed prompt plans
its fills as it goes), and a steady stream of short prompts must not hold a long one back for ever.

A request whose prompt is in joins the running batch (prompts and running requests together up to
``max_active``), and its first token goes out at once; the cache work its prompt left for later (the ``exact``
cold policy's fill) runs as a piece of a later step, after that token. Then every running request decodes one
token in one forward (``decoding.step_together``); a request leaves the batch at the step it finishes, fails or
is cancelled.

Requests come from ``add`` or, when there is room, from ``source`` (a queue's head, pulled only then, so that a
bounded queue in front keeps its meaning); a request begun whole (a ``Generation``, ``Engine.run_together``'s)
joins the running batch at once. Cancellation is the request's own flag, read in every state: a waiting
request is dropped when its turn comes, a prompt stops before its next piece, a decoding one ends at its next token.
A request's failure (its start, a piece of its prompt, its token, its output) is its own; a failed batched forward
fails the requests in it, and nothing else. ``notify(event, request)`` is told of each change as it happens
(``status.Event``: the first token's ``FIRST`` before that token goes out, ``DONE`` at an end with the request's
status saying which, ``ERROR`` at a failure), so a caller hands results on in order.

A background request (``add(..., background=True)``: the server's shadow runs) waits until nothing else is in hand
and nothing waits; then its prompt runs a piece in each step that has nothing else to run, so a request that
arrives meanwhile goes first and waits for one piece of it at most. At most ``max_background`` wait, the oldest
dropped first.

It knows nothing of threads, queues, asyncio, HTTP or metrics: the server's worker, and the in-process batches,
drive it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .decoding import Decoder, Generation, Piece, step_together
from .defaults import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS
from .request import Request, either
from .status import Event, Status

MAX_PROMPTS = 4  # prompts running at once, each holding its request state while it fills
log = logging.getLogger(__name__)
Notify = Callable[[Event, Request], None]
Source = Callable[[bool], "Request | None"]


@dataclass
class StepReport:
    """What a step ran: the prompt tokens (every piece's), how many requests it decoded a token of, and the
    pieces, each as it was announced."""

    prefilled: int = 0
    decoded: int = 0
    pieces: list[Piece] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        *,
        max_active: int = MAX_ACTIVE,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        source: Source | None = None,
        notify: Notify | None = None,
        max_background: int | None = None,
    ) -> None:
        if max_active < 1:
            raise ValueError("max_active must be >= 1")
        if max_num_batched_tokens < max_active:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be at least max_active ({max_active}):"
                " each running request takes a token of every step"
            )
        self.max_active, self.max_num_batched_tokens = max_active, max_num_batched_tokens
        self.source, self.notify = source, notify
        self.waiting: deque[Request] = deque()
        # the requests whose prompts are running, a piece at a time, in the order they go in the next step
        self.prompts: deque[Request] = deque()
        self.running: list[Request] = []
        # deferred fills (the request, its fill, the piece it is), each waiting for a step with room
        self.fills: deque[tuple[Request, Callable[[], object], Piece]] = deque()
        self._begun = 0  # prompts begun so far: each request's ``order``
        # requests that run only when nothing else is in hand, the oldest first (the first one may be running)
        self.background: deque[Request] = deque(maxlen=max_background)

    def add(self, request: Request, background: bool = False) -> None:
        (self.background if background else self.waiting).append(request)

    @property
    def prefilling(self) -> Request | None:
        """The oldest request whose prompt is running."""
        return min(self.prompts, key=lambda r: r.order, default=None)

    @property
    def idle(self) -> bool:
        """Nothing waiting here, no prompt running, nothing decoding, no background request left."""
        return self.busy_with_nothing and not self.background

    @property
    def busy_with_nothing(self) -> bool:
        """Nothing waiting here, no prompt running, nothing decoding: what a background request waits for."""
        return not self.waiting and not self.prompts and not self.running and not self.fills

    def in_hand(self) -> list[Request]:
        """The requests begun and not ended: the ones prefilling and the running ones."""
        return [*self.running, *self.prompts]

    def step(self, wait: bool = True) -> StepReport:
        """Prompts, then one token of every running request. ``wait``: with nothing running, ``source`` may block
        briefly for a request."""
        report = StepReport()
        self._admit(wait, report)
        if self.running:
            report.decoded = len(self.running)
            self._decode()
        return report

    def run(self) -> None:
        """Step until nothing is left: the whole loop of a driver with every request added up front."""
        while not self.idle:
            self.step(wait=False)

    def fail_all(self, exc: BaseException) -> None:
        """Every request in hand fails with ``exc`` (a step that failed outside any one request)."""
        for request in self.in_hand():
            self._fail(request, exc)
        self.running.clear()
        self.fills.clear()
        self.prompts.clear()

    # -- prompts --------------------------------------------------------------------------------------------------

    def _admit(self, wait: bool, report: StepReport) -> None:
        """Prompt pieces while the budget lasts: the running requests' deferred fills first, then the prompt
        running and the ones waiting, in turn. A splittable piece is cut to what is left, an atomic one waits
        for a step with room, unless nothing else has run in this one; a token of each running request's
        decode, and of the prompt's own should this piece finish it, is kept back."""
        while self.fills:
            request, fill, piece = self.fills[0]
            if not self._fits(piece, report, 0):
                return
            self.fills.popleft()
            self._ran(report, piece, piece.tokens)
            try:
                fill()
            except Exception as exc:
                if request in self.running:
                    self.running.remove(request)
                    self._fail(request, exc)
                else:  # its answer is out already: only the cache missed what the fill would have stored
                    log.exception("a deferred fill failed after its request ended")
        # Prompts begin when there is room, whatever the budget left, and a prompt's first step is its own turn: it
        # goes before those running already, which then take their turns round robin.
        begun: list[Request] = []
        while len(self.running) + len(self.prompts) < self.max_active and len(self.prompts) < MAX_PROMPTS:
            idle = not self.running and not report.pieces and not self.prompts and not self.background
            request = self._next(wait and idle)
            if request is None:
                break
            if self._begin(request):
                begun.append(request)
        running = [r for r in list(self.prompts) if r not in begun]
        # the newcomers take half of what is left, at most, together, while older prompts wait for their turn
        pool = max(1, (self._left(report) - 1) // 2) if running else None
        for request in begun:
            before = report.prefilled
            self._run_prompt(request, report, pool)
            if pool is not None:
                pool -= report.prefilled - before
        for request in running:
            self._run_prompt(request, report)
        if len(self.prompts) > 1:
            self.prompts.rotate(-1)  # who went first goes last next step
        if self.background and not report.pieces and self.busy_with_nothing:
            self._background_piece(report)

    def _background_piece(self, report: StepReport) -> None:
        """One piece of the oldest background request's prompt (begun here if it has not been, unless it was
        cancelled while it waited); once its prompt is in, it joins the running batch as any request does."""
        request = self.background[0]
        if request.pending is None:
            if request.cancelled():
                self.background.popleft()
                self._end(request, Status.CANCELLED, Event.DONE)
                return
            if not self._start(request):
                self.background.remove(request)
                return
        piece = self._piece(request, self.background)
        if piece is not None:
            limit = max(1, self._left(report) - 1) if piece.splittable else None
            self._advance(request, report, piece, limit, self.background)

    def _run_prompt(self, request: Request, report: StepReport, share: int | None = None) -> None:
        """Pieces of ``request``'s prompt while they fit in the step, and in ``share`` tokens (None: no share of its
        own): a splittable piece is cut to it, an atomic one over it waits for the prompt's turn."""
        ran = report.prefilled
        while request in self.prompts:
            if report.pieces and self._left(report) <= 1:
                return
            piece = self._piece(request)
            if piece is None or not self._fits(piece, report, 1):
                return
            limit = max(1, self._left(report) - 1) if piece.splittable else None
            if share is not None:
                room = share - (report.prefilled - ran)
                if room < 1 or (not piece.splittable and piece.tokens > room):
                    return
                limit = min(limit, room) if limit is not None else None
            self._advance(request, report, piece, limit)

    def _left(self, report: StepReport) -> int:
        return self.max_num_batched_tokens - len(self.running) - report.prefilled

    def _fits(self, piece: Piece, report: StepReport, own: int) -> bool:
        """Whether ``piece`` runs in this step (``own``: decode tokens it adds when it is done)."""
        if not report.pieces:
            return True  # something always runs: alone, an atomic piece may pass the budget
        left = self._left(report) - own
        return left >= 1 if piece.splittable else piece.tokens <= left

    @staticmethod
    def _ran(report: StepReport, piece: Piece, tokens: int) -> None:
        report.pieces.append(piece)
        report.prefilled += tokens

    def _next(self, wait: bool) -> Request | None:
        """The next request still wanted, or None."""
        while True:
            if self.waiting:
                request = self.waiting.popleft()
            elif self.source is not None:
                request = self.source(wait)
                if request is None:
                    return None
            else:
                return None
            if request.cancelled():
                self._end(request, Status.CANCELLED, Event.DONE)
                continue
            return request

    def _begin(self, request: Request) -> bool:
        """Start ``request`` as one of the prompts running; False when it ended there."""
        if not self._start(request):
            return False
        request.order = self._begun = self._begun + 1
        self.prompts.append(request)
        return True

    def _start(self, request: Request) -> bool:
        """Begin ``request``'s prompt; False when it ended there (it failed, or it was begun past its first token
        and is decoding already)."""
        request.mark(Status.PREFILLING)
        try:
            begun = request.begin(prefill_chunk=self.max_num_batched_tokens)
        except Exception as exc:  # ValueError: bad input; anything else: a bug
            self._fail(request, exc)
            return False
        if isinstance(begun, Generation):  # begun whole (``Engine.run_together``'s started requests)
            self._running(request, begun)
            return False
        request.pending = begun
        return True

    def _piece(self, request: Request, held: deque[Request] | None = None) -> Piece | None:
        """The next piece of ``request``'s prompt (its first look plans it); None when the prompt ended there: it
        failed, or it was in already, and it has left ``held`` (the prompts running, or the background)."""
        assert request.pending is not None
        held = self.prompts if held is None else held
        try:
            piece = request.pending.piece
        except Exception as exc:
            held.remove(request)
            self._fail(request, exc)
            return None
        if piece is None:
            self._prompt_in(request, held)
        return piece

    def _advance(
        self, request: Request, report: StepReport, piece: Piece, limit: int | None, held: deque[Request] | None = None
    ) -> None:
        """Run ``piece`` of ``request``'s prompt (cut to ``limit``). A cancelled request's prompt stops here, and
        one that ends here leaves ``held``."""
        assert request.pending is not None
        held = self.prompts if held is None else held
        if request.cancelled():
            held.remove(request)
            self._end(request, Status.CANCELLED, Event.DONE)
            return
        try:
            ran = request.pending.advance(limit)
        except Exception as exc:
            held.remove(request)
            self._fail(request, exc)
            return
        self._ran(report, piece, ran)
        request.prefilled_tokens += ran
        if request.pending.generation is not None:
            self._prompt_in(request, held)

    def _prompt_in(self, request: Request, held: deque[Request]) -> None:
        assert request.pending is not None and request.pending.generation is not None
        held.remove(request)
        self._running(request, request.pending.generation)

    def _running(self, request: Request, run: Generation) -> None:
        """``request``'s prompt is in: it joins the decoding batch, and its first token goes out at once, not after
        the others' prompts."""
        request.run = run
        request.mark(Status.RUNNING)
        own = run.decoder.cancelled  # the request's flag ends its decode too, whatever it began with
        run.decoder.cancelled = request.cancelled if own is None else either(own, request.cancelled)
        self._tell(Event.FIRST, request)
        try:
            run.decoder.take_now()
        except Exception as exc:
            self._fail(request, exc)
            return
        self.running.append(request)
        if run.fill is not None:  # after its first token, as a piece of a step with room, whenever the request ends
            self.fills.append((request, run.fill, Piece(run.fill_tokens)))
            run.fill = None

    # -- decoding -------------------------------------------------------------------------------------------------

    def _decode(self) -> None:
        """One token of every running request, in one forward; finished, cancelled and failed ones leave."""
        by_decoder = {id(r.run.decoder): r for r in self.running if r.run is not None}
        failures: dict[int, Exception] = {}

        def failed(decoder: Decoder, exc: Exception) -> None:
            failures[id(decoder)] = exc

        try:
            done = step_together([r.run.decoder for r in self.running if r.run is not None], failed)
        except Exception as exc:  # the batch's forward itself: every request in it fails
            for request in self.running:
                self._fail(request, exc)
            self.running.clear()
            return
        for key, finished in zip(list(by_decoder), done, strict=True):
            request = by_decoder[key]
            if key in failures:
                self.running.remove(request)
                self._fail(request, failures[key])
            elif finished:
                self.running.remove(request)
                self._finish(request)

    def _finish(self, request: Request) -> None:
        assert request.run is not None and request.run.decoder.finish is not None
        status = request.run.decoder.finish
        try:
            request.output = request.run.output()
        except Exception as exc:
            self._fail(request, exc)
            return
        if request.run.keep is not None:  # its state, for the conversation's next turn, before the answer goes out
            try:
                request.run.keep()
            except Exception:  # the answer is good: only the cache missed a state
                log.exception("keeping a request's state after its answer failed")
        request.run = request.pending = None  # its state (KV, linear states) is no longer needed
        self._end(request, status, Event.DONE)

    # -- endings --------------------------------------------------------------------------------------------------

    def _fail(self, request: Request, exc: BaseException) -> None:
        request.error = exc
        self._end(request, Status.FAILED, Event.ERROR)

    def _end(self, request: Request, status: Status, event: Event) -> None:
        request.mark(status)
        self._tell(event, request)

    def _tell(self, event: Event, request: Request) -> None:
        if self.notify is not None:
            self.notify(event, request)
