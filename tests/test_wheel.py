"""What a user installs is what the tree holds: the wheel built from this tree, installed with its extras into a
fresh virtual environment outside the tree, imports every package the tree has, runs the demo and serves a fleet
of one. Editable installs read the tree itself, so only a built wheel shows a package or file left out.

The install takes minutes, so it is made once per run and shared by the tests here: under xdist this module is
handed out first (tests/conftest.py), and the fleet test, which runs in the Ray group on another worker, waits on
a lock for the install that is already under way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).parents[1]
INSTALL_TIMEOUT_S = 1200
# The folders of the tree that are not the package (its tests, examples and docs).
NOT_SHIPPED = ("tests", "examples", "docs", ".ci")


def tree_files() -> list[str]:
    """The files git tracks or would track (untracked but not ignored), as paths relative to the root."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return sorted(f for f in out.decode().split("\0") if f and (ROOT / f).is_file())


def installed_name(path: str) -> str:
    """Where a file of the tree lands in the wheel: ``hypic_rag/`` as it is, every other top-level package folder
    as a subpackage of ``hypic_rag``."""
    return path if Path(path).parts[0] == "hypic_rag" else f"hypic_rag/{path}"


def shipped_sources() -> list[str]:
    """Every Python file of every package folder the tree has (a folder with an ``__init__.py``), outside its
    tests, examples and docs."""
    files = tree_files()
    packages = {str(Path(f).parent) for f in files if f.endswith("/__init__.py")}
    outside = tuple(folder + "/" for folder in NOT_SHIPPED)
    return [f for f in files if f.endswith(".py") and str(Path(f).parent) in packages and not f.startswith(outside)]


def tree_packages() -> list[str]:
    """Every package of the tree under its installed dotted name."""
    return sorted(
        installed_name(str(Path(f).parent)).replace("/", ".") for f in shipped_sources() if f.endswith("__init__.py")
    )


def _isolated_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: no path into this tree, no venv of ours, the hub offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1")
    return env


def _run(command: list[str], log: Path, timeout: float, **kwargs) -> str:
    """Run ``command``, its output appended to ``log``; its output, or an error carrying its tail."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    output = done.stdout + done.stderr
    with log.open("a") as f:
        f.write(f"$ {' '.join(command)}\n{output}\n")
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} ... exited {done.returncode}:\n{output[-4000:]}")
    return output


def _build_and_install(place: Path) -> dict[str, str]:
    """Copy the tree, build its wheel, install it with every extra into a new venv; what was made, by path."""
    log = place / "log.txt"
    source = place / "source"
    for f in tree_files():
        (source / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, source / f)
    wheels = place / "wheels"
    env = _isolated_env(place)
    build_log = _run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(wheels), str(source)],
        log,
        INSTALL_TIMEOUT_S,
        env=env,
        cwd=place,
    )
    (wheel,) = wheels.glob("hypic_rag-*.whl")
    venv = place / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], log, 120, env=env, cwd=place)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, "torch==2.13.0"], log, INSTALL_TIMEOUT_S, env=env, cwd=place)  # the CPU build, as `make` does
    constraints = ["-c", str(ROOT / "constraints.txt")]
    _run([*pip, *constraints, f"{wheel}[all]"], log, INSTALL_TIMEOUT_S, env=env, cwd=place)
    return {"wheel": str(wheel), "venv": str(venv), "build_log": build_log}


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, str]:
    """The wheel and the venv it is installed in, made once for every worker of this run."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the run's folder, above each worker's own
    place = shared / "wheel-install"
    record = shared / "wheel-install.json"
    with FileLock(str(shared / "wheel-install.lock")):
        if not record.exists():
            shutil.rmtree(place, ignore_errors=True)
            place.mkdir()
            try:
                made = _build_and_install(place)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                made = {"error": str(exc)}
            record.write_text(json.dumps(made))
    made = json.loads(record.read_text())
    if "error" in made:
        pytest.fail(f"building or installing the wheel failed (once, for every test here): {made['error']}")
    return made


def _venv_run(installed: dict[str, str], args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    bin_dir = Path(installed["venv"]) / "bin"
    env = _isolated_env(cwd)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def test_the_tree_lists_the_packages_it_has():
    """The lists below are read from the tree: the package, the fleet and the top-level folders are in them."""
    packages = tree_packages()
    assert {"hypic_rag", "hypic_rag.fleet", "hypic_rag.kernels", "hypic_rag.integrations"} <= set(packages)
    assert "hypic_rag.eval.bench" in packages and not any(p.startswith(("tests", "examples")) for p in packages)


def test_the_wheel_holds_every_module_and_the_bundled_model(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    missing = [f for f in shipped_sources() if installed_name(f) not in names]
    assert not missing, f"the wheel leaves out {len(missing)} module(s) of the tree: {missing[:20]}"
    model = [f for f in tree_files() if f.startswith("hypic_rag/assets/default_model/")]
    assert model and all(f in names for f in model)


def test_the_build_warns_of_nothing(installed):
    """setuptools' warnings (an ambiguous package list, a deprecated option) name a ...Warning class."""
    lines = installed["build_log"].splitlines()
    warnings = sorted({line.strip() for line in lines if re.search(r"\w*Warning\b", line)})
    assert not warnings, "\n".join(warnings)


def test_every_package_of_the_tree_imports_from_the_install(installed, tmp_path):
    script = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        out[name] = importlib.import_module(name).__file__\n"
        "    except Exception as exc:\n"
        "        out[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(out))\n"
    )
    done = _venv_run(installed, ["python", "-c", script, *tree_packages()], tmp_path, 300)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    venv = str(Path(installed["venv"]).resolve())
    wrong = {name: where for name, where in found.items() if not str(where).startswith(venv)}
    assert not wrong, f"not imported from the installed wheel: {wrong}"


def test_the_demo_runs_from_the_install(installed, tmp_path):
    done = _venv_run(installed, ["hypic-rag", "demo"], tmp_path, 600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "hypic-rag demo:" in done.stdout and "bundled model" in done.stdout


@pytest.mark.ray
def test_a_fleet_of_one_answers_from_the_install(installed, tmp_path):
    """``hypic-rag serve --replicas 1``: the Ray Serve fleet, from the wheel, answers one chat request."""
    import httpx

    from hypic_rag.testing.server import free_port, kill_group

    bin_dir = Path(installed["venv"]) / "bin"
    env = _isolated_env(tmp_path)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [str(bin_dir / "hypic-rag"), "serve", "--replicas", "1", "--port", str(port), "--threads-per-replica", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its Ray processes too are stopped by the group below
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"serve --replicas 1 exited {proc.returncode}:\n{log.read()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the fleet did not come up in 300 s"
            time.sleep(0.5)
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Where does Ana live?"}], "max_tokens": 4}
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the fleet stops what it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc)
        log.close()
