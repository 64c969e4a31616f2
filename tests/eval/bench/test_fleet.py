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


def test_routers_and_traffic_are_chosen_by_name():
    from hypic_rag.eval.bench.fleet import parser

    args = parser().parse_args(["--routers", "affinity,prefix,affinity", "--traffic", "fixed_order"])
    assert args.routers == ("affinity", "prefix") and args.traffic == ("fixed_order",)
    assert parser().parse_args([]).routers == ("affinity", "prefix", "power_of_two", "round_robin")


@pytest.mark.parametrize("argv", [["--routers", "nginx"], ["--traffic", ","], ["--routers", "affinity,nginx"]])
def test_unknown_routers_and_traffic_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "expected some of" in capsys.readouterr().err
