"""constraints.txt, the pins CI installs with, against pyproject.toml's ranges: a range changed without
refreshing the pins (``make lock``) would leave CI testing versions users can no longer get."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra if not r.startswith("hypic-rag")]
    return reqs


def test_every_requirement_is_pinned_within_its_range():
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "torch":  # installed first, at the version the Makefile names
            continue
        assert name in pins, f"{req.name} is not pinned in constraints.txt: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {req}"


def test_the_pins_leave_torch_to_the_makefile():
    assert "torch" not in _pins()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'pip install "torch==2\.13\.0"', makefile) and "-c constraints.txt" in makefile
