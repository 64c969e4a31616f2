"""The live fleet benchmark's refusals (its runs need a fleet of their own; its P90 is ``slo.percentile``)."""

from __future__ import annotations

import pytest

from hypic_rag.eval.bench.fleet import main


@pytest.mark.parametrize(
    "argv",
    [["--replicas", "0"], ["--memory-share", "0"], ["--k", "9"], ["--documents", "4"], ["--requests", "0"]],
)
def test_bad_arguments_are_refused_before_anything_starts(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert "must be >= 1" in err or "--documents >= --topic-size >= --k" in err
