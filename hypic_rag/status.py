"""The one vocabulary of a request's life, for the scheduler, every driver and the decoder alike.

A request is waiting, its prompt running, or decoding, until it ends in one of the finished states; each finished
state but ``FAILED`` carries the reason an answer gives for its end (``GenerationOutput.finish_reason``, OpenAI's
``finish_reason``), so the status and the reason are one value. ``Event`` is what a driver is told of a request:
its first token, a piece of its text, its end with an output, or its failure; the server's stream sends the same
names.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    WAITING = "waiting"
    PREFILLING = "prefilling"  # its prompt running, a piece a step
    RUNNING = "running"  # decoding
    STOPPED = "stop"  # a stop id or a stop string
    LENGTH = "length"  # max_new_tokens
    CONTEXT = "context"  # the model's context is full
    CANCELLED = "cancelled"  # the caller gave up
    FAILED = "failed"  # an error of its own (``Request.error``)

    @property
    def ended(self) -> bool:
        return self not in (Status.WAITING, Status.PREFILLING, Status.RUNNING)


class Event(StrEnum):
    FIRST = "first"  # the prompt is in and the first token chosen
    DELTA = "delta"  # text the answer adds
    DONE = "done"  # ended with an output (cancelled before its first token: none)
    ERROR = "error"  # failed
