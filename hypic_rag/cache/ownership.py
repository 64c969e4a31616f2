"""Which files of a cache folder the disk tier may touch: only those it can prove it wrote.

The folder a user names (``cache_dir``) may hold anything, our weight-digest file included, so the tier never
works in it directly: it keeps its files in a subfolder it made (``SUBFOLDER``) and marks it as its own
(``MARKER``). A subfolder of that name it did not mark, a symlinked folder and a symlinked index are refused
before anything is opened: SQLite follows a link and writes into whatever file it names. Inside its folder the
tier deletes nothing but value files of the shape diskcache gives them, that are regular files (not links)
and that no index row names once they are old enough not to be a live writer's (``sweep_orphans``).
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

SUBFOLDER = "segments"
MARKER = ".hypic-rag-segments"  # written by the tier when it makes (or takes an empty) subfolder
INDEX = ("cache.db", "cache.db-wal", "cache.db-shm")
# The names diskcache's ``Disk.filename`` gives: two levels of two hex digits, then 28 hex digits and ``.val``.
VALUE_NAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")
_HEX_DIR = re.compile(r"[0-9a-f]{2}")
ORPHAN_AGE_S = 600.0  # a value file without an index row this old is a killed writer's, not one still writing


def tier_folder(root: Path) -> Path:
    """The tier's own folder under ``root``, checked (nothing is created): ValueError when ``root`` or the
    subfolder is a symlink or not a folder, when the subfolder holds files but not the tier's mark, or when an
    index file is a symlink."""
    if root.is_symlink():
        raise ValueError(f"cache_dir {str(root)!r} is a symlink; give the folder it points to ({root.resolve()})")
    if root.exists() and not root.is_dir():
        raise ValueError(f"cache_dir {str(root)!r} is a file, not a folder")
    folder = root / SUBFOLDER
    if folder.is_symlink():
        raise ValueError(f"the segment cache folder {str(folder)!r} is a symlink: refusing to write through it")
    if not folder.exists():
        return folder
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is a file, not the segment cache folder; move it away")
    for name in INDEX:
        if (folder / name).is_symlink():
            raise ValueError(f"the segment cache index {str(folder / name)!r} is a symlink: refusing to open it")
    # Listed before the mark is looked for: the tier writes its mark before any other file, so files seen here
    # were written after a mark that another engine may be making at this moment, and the look then finds it.
    if any(folder.iterdir()) and not _marked(folder):
        raise ValueError(
            f"{str(folder)!r} holds files hypic-rag did not write (it has no {MARKER}); "
            "move them away or give another cache_dir"
        )
    return folder


def claim(folder: Path) -> None:
    """Make ``folder`` (checked by ``tier_folder``) and mark it as the tier's."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not _marked(folder):
        try:
            fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:  # another process marked it first
            return
        with os.fdopen(fd, "w") as out:
            out.write("hypic-rag segment cache: the files here are written and removed by hypic-rag\n")


def _marked(folder: Path) -> bool:
    marker = folder / MARKER
    return marker.is_file() and not marker.is_symlink()


def value_files(folder: Path) -> list[tuple[str, os.stat_result]]:
    """Every value file of the tier's shape under ``folder``: regular files, reached without following links."""
    out = []
    for first in _hex_dirs(folder):
        for second in _hex_dirs(first):
            for file in second.iterdir():
                name = f"{first.name}/{second.name}/{file.name}"
                info = file.lstat()
                if VALUE_NAME.fullmatch(name) and _regular(info):
                    out.append((name, info))
    return out


def sweep_orphans(folder: Path, indexed: set[str], min_age_s: float = ORPHAN_AGE_S) -> int:
    """Remove the value files no index row names (``indexed``) that are older than ``min_age_s``: what a killed
    writer left, partial or whole. Then the empty two-hex-digit folders. The number of files removed."""
    now, removed = time.time(), 0
    for name, info in value_files(folder):
        if name not in indexed and now - info.st_mtime > min_age_s:
            try:
                (folder / name).unlink()
                removed += 1
            except FileNotFoundError:  # another process swept it
                pass
    remove_empty_dirs(folder)
    return removed


def remove_empty_dirs(folder: Path) -> None:
    """The two-hex-digit folders under ``folder`` that hold nothing."""
    for first in _hex_dirs(folder):
        for second in _hex_dirs(first):
            _rmdir(second)
        _rmdir(first)


def _hex_dirs(folder: Path) -> list[Path]:
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [p for p in entries if _HEX_DIR.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]


def _regular(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not empty, or gone
        pass
