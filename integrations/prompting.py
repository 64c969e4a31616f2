"""What the integrations share: the engines they load, the request options as their fields, the registry of
retrieved texts, text parts and streaming. Every integration sends OpenAI-style messages to ``Engine.chat``,
written as the engine's chat format reads them (``Engine.chat_format``), whose checkpoint template renders the prompt;
none of them writes a prompt format of its own.

Texts that a retriever wrapper registered are found again inside flat strings, because LCEL chains
join documents into one string before the model sees them (``TextRegistry.parts`` gives them as
``engine.chat`` text parts of kind ``document``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import queue
import threading
import typing
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hypic_rag import Engine, GenerationOutput
from hypic_rag.chat.formats.bundled import collapse_space
from hypic_rag.options import OPTIONS, SPELLINGS, RequestOptions

M = TypeVar("M")

# The key under which integrations put the engine's stats and read a content block's segment kind.
HYPIC_KEY = "hypic"

# The name the integrations give the bundled model; ``None`` means it too.
DEFAULT_MODEL = "hypic-default"

# How the frameworks' fields spell a request option, where it differs from the engine's name.
FIELD_NAMES = {"max_new_tokens": "max_tokens"}

_ENGINE_LOCK = threading.Lock()
_ENGINES: dict[tuple[str | None, str | None, str | None, str], Engine] = {}


def load_engine(
    model: str | Path | None = None,
    cache_dir: str | Path | None = None,
    cache_url: str | None = None,
    entry_dtype: str = "float32",
) -> Engine:
    """``Engine.from_pretrained(model, cache_dir=cache_dir, cache_url=cache_url, entry_dtype=entry_dtype)``,
    loaded once per (model, cache_dir, cache_url, entry_dtype) per process and shared by every integration;
    ``None`` or ``"hypic-default"`` is the bundled model. A local directory is keyed by its resolved path, a hub
    id by itself."""
    name = None if model is None or str(model) == DEFAULT_MODEL else str(model)
    if name is not None and Path(name).expanduser().exists():
        name = str(Path(name).expanduser().resolve())
    where = str(Path(cache_dir).expanduser().resolve()) if cache_dir is not None else None
    key = (name, where, cache_url, entry_dtype)
    with _ENGINE_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = Engine.from_pretrained(name, cache_dir=where, cache_url=cache_url, entry_dtype=entry_dtype)
        return _ENGINES[key]


def default_engine() -> Engine:
    """The bundled model, loaded once per process and shared by every integration."""
    return load_engine()


def with_request_options(
    base: type[M], *, exclude: Collection[str] = (), aliases: Mapping[str, str] | None = None
) -> type[M]:
    """``base`` (a framework's pydantic model class) with every request option (``hypic_rag.options``) but
    ``exclude`` as a field of its own, spelled as the frameworks spell it (``FIELD_NAMES``: ``max_tokens``), with
    the option's default and help; ``aliases`` adds another name a field is also known by. So a chat model's
    constructor takes the options without the integration listing them."""
    from pydantic import Field, create_model  # the frameworks' dependency, not the engine's

    hints = typing.get_type_hints(RequestOptions)
    fields: dict[str, Any] = {}
    for option in dataclasses.fields(RequestOptions):
        if option.name in exclude:
            continue
        name = FIELD_NAMES.get(option.name, option.name)
        field = Field(default=option.default, description=option.metadata.get("help"), alias=(aliases or {}).get(name))
        fields[name] = (hints[option.name], field)
    return create_model(f"{base.__name__}Options", __base__=base, __module__=base.__module__, **fields)


def option_fields(model: Any) -> list[str]:
    """The request-option fields of a model class made by ``with_request_options``, by their field names."""
    return [name for name in type(model).model_fields if SPELLINGS.get(name, name) in OPTIONS]


def request_options(model: Any, overrides: Mapping[str, Any] | None = None) -> RequestOptions:
    """The options a framework model's fields set, with a call's ``overrides`` (by the same names) on top;
    a bad value is a ``ValueError`` that names the field."""
    own = {name: getattr(model, name) for name in option_fields(model)}
    return RequestOptions.from_mapping({**own, **(overrides or {})})


class TextRegistry:
    """Texts a retriever handed out, found again in flat prompts.

    Process-wide and bounded (least recently registered dropped first): a ContextVar set inside one
    branch of a ``RunnableParallel`` is not visible to the model step, so the registry cannot be
    scoped to a run.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def register(self, texts: Iterable[str]) -> None:
        with self._lock:
            for text in texts:
                text = text.strip()
                if not text:
                    continue
                key = hashlib.sha256(text.encode()).hexdigest()
                self._texts.pop(key, None)
                self._texts[key] = text
                while len(self._texts) > self.capacity:
                    self._texts.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._texts.clear()

    def __len__(self) -> int:
        return len(self._texts)

    def spans(self, text: str) -> list[tuple[bool, str]]:
        """``text`` as ``(is_registered, run)`` runs whose concatenation is ``text``: each registered text
        found (its first occurrence, longest texts first, never overlapping) is a run of its own."""
        with self._lock:
            known = sorted(self._texts.values(), key=len, reverse=True)
        found: list[tuple[int, str]] = []
        masked = text
        for doc in known:
            at = masked.find(doc)
            if at < 0:
                continue
            found.append((at, doc))
            masked = masked[:at] + "\0" * len(doc) + masked[at + len(doc) :]
        runs: list[tuple[bool, str]] = []
        pos = 0
        for at, doc in sorted(found):
            if at > pos:
                runs.append((False, text[pos:at]))
            runs.append((True, doc))
            pos = at + len(doc)
        if pos < len(text):
            runs.append((False, text[pos:]))
        return runs

    def split(self, text: str) -> tuple[list[str], str]:
        """The registered texts found in ``text`` (in order of appearance) and what is left around them,
        its whitespace collapsed."""
        runs = self.spans(text)
        leftover = collapse_space(" ".join(run for found, run in runs if not found))
        return [run for found, run in runs if found], leftover

    def parts(self, text: str) -> list[dict[str, Any]]:
        """``text`` as ``engine.chat`` text parts in order: registered texts are ``document`` parts, the
        text around them plain parts; their concatenation is ``text``."""
        return [text_part(run, "document" if found else None) for found, run in self.spans(text)]


REGISTRY = TextRegistry()


def cache_ahead(
    engine: Engine,
    chats: Iterable[list[dict[str, Any]]],
    options: RequestOptions,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Cache the segments of ``chats`` (each one document's request, rendered on its own so a corpus may be
    far past the context) as requests with ``options`` will find them: the home of every integration's
    index-time caching. The number of segments computed."""
    rendering = options.chat_template_kwargs, options.segmentation
    segments = [s for chat in chats for s in engine.render(chat, None, *rendering).segments]
    return engine.cache_segments(segments, options.seam, progress) if segments else 0


def text_part(text: str, kind: str | None = None) -> dict[str, Any]:
    """An ``engine.chat`` text part; with ``kind``, one segment of that kind."""
    part: dict[str, Any] = {"type": "text", "text": text}
    if kind is not None:
        part[HYPIC_KEY] = {"kind": kind}
    return part


def token_usage(stats: dict[str, Any]) -> dict[str, Any]:
    """LangChain's ``UsageMetadata``, with the prompt tokens served from the cache as ``cache_read``, as
    ``ChatOpenAI`` reads them from our server's ``prompt_tokens_details.cached_tokens``."""
    inp, out = int(stats.get("prompt_tokens", 0)), int(stats.get("generated_tokens", 0))
    return {
        "input_tokens": inp,
        "output_tokens": out,
        "total_tokens": inp + out,
        "input_token_details": {"cache_read": int(stats.get("cached_tokens", 0))},
    }


def tool_names(tools: Sequence[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def stream_tokens(
    run: Callable[[Callable[[int, str | None], None], Callable[[], bool]], GenerationOutput],
) -> Iterator[str | GenerationOutput]:
    """Text deltas as the engine picks tokens, then the finished output.

    ``run(on_token, cancelled)`` calls the engine; it runs in a worker thread so the caller can yield. A
    consumer that stops reading (a ``break``, a closed generator) cancels it at the next token, so an
    abandoned stream does not keep the engine to itself until ``max_tokens``.
    """
    q: queue.Queue = queue.Queue()
    stop = threading.Event()

    def work() -> None:
        try:
            q.put(run(lambda _id, delta: q.put(delta or ""), stop.is_set))
        except BaseException as exc:  # re-raised in the caller's thread
            q.put(exc)

    threading.Thread(target=work, daemon=True).start()
    try:
        while True:
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, GenerationOutput):
                return
    finally:
        stop.set()
