"""`make demo` must keep working: its parity checks pass and it shows every mode."""

from __future__ import annotations

from hypic_rag.demo import run


def test_demo_passes_its_checks_and_shows_every_mode():
    lines: list[str] = []
    assert run(log=lines.append)
    table = "\n".join(lines)
    assert "all checks passed" in table
    for mode in ("full", "prefix", "pic", "hypic"):
        assert any(line.startswith(mode) for line in lines), mode
