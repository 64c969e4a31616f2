"""How much of a disk the disk tier takes: a share of the free space by default, none when the disk is nearly full.

A fixed budget (it was 8 GiB) fills a small volume before anything is evicted; then SQLite cannot even open
its index, and every request pays a failed open. So the budget is a tenth of what the tier could have (the
free space plus what it holds already), at most 8 GiB, and below ``MIN_FREE_BYTES`` free the tier stays off
and the engine serves from memory, looking again every ``RECHECK_S`` seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FRACTION = 0.10
MAX_BUDGET = 8 << 30
MIN_BUDGET = 1 << 20  # below this a budget holds no useful entry
MIN_FREE_BYTES = 64 << 20
RECHECK_S = 60.0


def free_bytes(path: Path) -> int:
    """The free space of the disk that holds ``path`` (or would: its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return int(shutil.disk_usage(candidate).free)
    return int(shutil.disk_usage(Path.cwd()).free)


def default_budget(free: int, held: int) -> int:
    """The tier's byte budget when none is given: a tenth of the free space plus what it already ``held``."""
    return max(MIN_BUDGET, min(MAX_BUDGET, int(FRACTION * (free + held))))
