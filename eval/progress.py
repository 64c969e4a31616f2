"""The progress bar of the commands that run for minutes (``demo``, ``eval``, ``bench``): tqdm's, on stderr, where
an extra installed it (``demo``, ``eval``); a silent stand-in where none did, so the callers never branch."""

from __future__ import annotations

from typing import Any


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, desc: str, unit: str = "it", *, leave: bool = True) -> Any:
    """A bar of ``total`` steps (its estimate of the time left comes with it), or the stand-in."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, leave=leave)
