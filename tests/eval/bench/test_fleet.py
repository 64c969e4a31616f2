"""The live fleet benchmark's own arithmetic and its refusals (its runs need a fleet of their own)."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.fleet import main, p90


def test_p90_is_the_value_ninety_percent_of_answers_came_within():
    assert p90([float(i) for i in range(1, 11)]) == 10.0
    assert p90([float(i) for i in range(1, 101)]) == 91.0
    assert p90([3.0]) == 3.0


@pytest.mark.parametrize(
    "argv",
    [["--replicas", "0"], ["--memory-share", "0"], ["--k", "9"], ["--documents", "4"], ["--requests", "0"]],
)
def test_bad_arguments_are_refused_before_anything_starts(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert "must be >= 1" in err or "--documents >= --topic-size >= --k" in err
