"""The benchmarks' shared timing: a first run's setup never counts as a mode's time."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.common import best_of


def test_best_of_runs_an_untimed_warm_up_first():
    times = iter([9.0, 1.0, 2.0])  # the first run pays for lazy setup

    def trial() -> tuple[float, str]:
        t = next(times)
        return t, f"took {t}"

    assert best_of(1, trial) == (1.0, "took 1.0")  # with one repeat, the warm-up is still not the figure
    assert best_of(1, lambda: (5.0, None), warmup=0) == (5.0, None)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        best_of(0, trial)
