"""Where a checkpoint lives: the bundled model, a local directory, or a Hugging Face hub id.

Hub ids go through ``huggingface_hub.snapshot_download`` rather than hand-written cache walking: it
knows the cache layout (``refs/``, ``snapshots/``, symlinked blobs), resolves branches and tags, and
refuses incomplete snapshots. We add two things. The cache location and offline switch are read from
the environment at call time, because huggingface_hub freezes them into module constants on import
and callers (tests, servers started from a script) often set them later. And every failure becomes a
``ValueError`` that says what happened and what to do, as the rest of the API does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .model.loading import default_model_path

__all__ = ["CHECKPOINT_PATTERNS", "hub_cache_dir", "hub_offline", "is_hub_id", "resolve_checkpoint"]

# What the runtime reads from a checkpoint; anything else in a repo (ONNX exports, GGUF, images) is
# skipped so a download fetches only what loads.
CHECKPOINT_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "additional_chat_templates/*.jinja",
    "special_tokens_map.json",
]

# huggingface_hub's own rule for a repo id, restricted to the "org/name" shape: word characters, "."
# and "-", at most 96 characters, no "--" or ".." and no leading or trailing "-" or ".".
_PART = r"[A-Za-z0-9_](?:[\w.\-]*[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^{_PART}/{_PART}$")
_TRUE = {"1", "true", "yes", "on"}


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the shape of a hub model id, ``org/name``."""
    return len(text) <= 96 and "--" not in text and ".." not in text and _HUB_ID.match(text) is not None


def hub_cache_dir() -> Path:
    """The hub cache directory as huggingface_hub would compute it from the environment now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        home = Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser()
    else:
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface"
    return home / "hub"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) is set to a true value now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def resolve_checkpoint(path: str | Path | None, revision: str | None = None) -> Path:
    """The local directory holding the checkpoint ``path`` names.

    ``None`` is the bundled model; an existing directory is itself; a string ``org/name`` that is no
    local path is a hub id, found in the local Hugging Face cache or downloaded into it. ``revision``
    (a branch, tag or commit) applies to hub ids only. Raises ``ValueError`` when nothing fits.
    """
    if path is None:
        if revision is not None:
            raise ValueError("revision applies to hub ids only, not to the bundled default model")
        bundled = default_model_path()
        if not (bundled / "config.json").is_file():
            raise ValueError(
                f"the bundled default model is missing from this install ({bundled}); reinstall "
                "hypic-rag or pass the path of a local Qwen3-Next or Qwen3.5 checkpoint"
            )
        return bundled
    local = Path(path).expanduser()
    if local.is_dir():
        if revision is not None:
            raise ValueError(f"revision applies to hub ids only; {str(path)!r} is a local directory")
        return local
    if local.exists():
        raise ValueError(f"checkpoint path {local} is not a directory")
    if not isinstance(path, str) or not is_hub_id(path):
        raise ValueError(
            f"checkpoint directory {local} does not exist and {str(path)!r} is not a hub id (expected 'org/name')"
        )
    return _snapshot(path, revision)


def _snapshot(repo_id: str, revision: str | None) -> Path:
    """The cached (or freshly downloaded) snapshot of ``repo_id`` at ``revision``."""
    if revision is not None and (not revision or revision.startswith("/") or ".." in revision.split("/")):
        raise ValueError(f"revision {revision!r} is not a branch, tag or commit name")
    # Imported here: only hub ids need it, and importing it costs a noticeable fraction of a second.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # The HTTP library's own base error (a proxy failure, say), whichever library this huggingface_hub
    # release is built on: it is a base of HfHubHTTPError beside OSError.
    transport = tuple(b for b in HfHubHTTPError.__mro__[1:] if b not in (OSError, Exception, BaseException, object))
    cache = hub_cache_dir()
    offline = hub_offline()
    at = f" at revision {revision!r}" if revision is not None else ""
    download = f"hf download {repo_id}" + (f" --revision {revision}" if revision is not None else "")
    fix = f"download it first ({download}) or pass a local checkpoint directory"
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=CHECKPOINT_PATTERNS,
            cache_dir=cache,
            local_files_only=offline,
        )
    except IncompleteSnapshotError as exc:
        raise ValueError(
            f"hub id {repo_id!r}{at} is only partly in the local Hugging Face cache ({cache}): {exc}; {fix}"
        ) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        if offline:
            why = "HF_HUB_OFFLINE is set"
        else:
            why = "the Hugging Face Hub could not be reached"
            if exc.__cause__ is not None:
                why += f" ({type(exc.__cause__).__name__})"
        raise ValueError(
            f"hub id {repo_id!r}{at} is not in the local Hugging Face cache ({cache}) and {why}: {fix}"
        ) from exc
    except GatedRepoError as exc:
        raise ValueError(
            f"hub id {repo_id!r} is gated: accept its terms on huggingface.co and log in (hf auth login), "
            "or pass a local checkpoint directory"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ValueError(
            f"hub id {repo_id!r} was not found on the Hugging Face Hub (or is private: log in with "
            "hf auth login); check the id or pass a local checkpoint directory"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ValueError(f"hub id {repo_id!r} has no revision {revision!r}; check the branch, tag or commit") from exc
    except HFValidationError as exc:
        raise ValueError(f"{repo_id!r} is not a valid hub id: {exc}") from exc
    except HfHubHTTPError as exc:
        raise ValueError(
            f"the Hugging Face Hub refused hub id {repo_id!r}{at} ({exc}); try again later or {fix}"
        ) from exc
    except (OSError, *transport) as exc:  # connection resets, proxies, a cache directory we cannot write
        raise ValueError(
            f"cannot fetch hub id {repo_id!r}{at} into {cache} ({type(exc).__name__}: {exc}); {fix}"
        ) from exc
    snapshot = Path(folder)
    if not (snapshot / "config.json").is_file():
        raise ValueError(f"hub id {repo_id!r}{at} has no config.json ({snapshot}); it is not a model checkpoint")
    return snapshot
