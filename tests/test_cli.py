from __future__ import annotations

import pytest

from hypic_rag.cli import main


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out


def test_bad_bench_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--lengths", "4k"])
    assert "comma-separated token counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--layers", "0"])
