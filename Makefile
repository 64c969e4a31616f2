# Each target creates or reuses the local venv. torch==2.13.0 (a CPU wheel) goes in first when no
# torch is present, so that pip never resolves a multi-GB CUDA build. Everything else installs at the
# versions pinned in constraints.txt; `make lock` resolves pyproject.toml's ranges anew and rewrites it.
PYTHON ?= python3
VENV ?= .venv
# pytest-xdist workers: every core, at most 8 (`make test JOBS=0`: no workers, one process).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 8 ? n : 8 )))
PYTEST_JOBS = -n $(JOBS) --dist loadgroup
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hypic-installed
DEMO_STAMP := $(VENV)/.hypic-demo-installed

.PHONY: demo test test-fast test-latest bench lint clean redis-server lock

$(PY):
	$(PYTHON) -m venv $(VENV)

TORCH_FIRST = $(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"

$(STAMP): pyproject.toml setup.py constraints.txt | $(PY)
	$(TORCH_FIRST)
	$(PY) -m pip install -c constraints.txt -e ".[all]"
	touch $@

# The demo needs only the engine and its own extra (not Ray, the test tools or the benchmarks' reference).
$(DEMO_STAMP): pyproject.toml setup.py constraints.txt | $(PY)
	$(TORCH_FIRST)
	$(PY) -m pip install -c constraints.txt -e ".[demo]"
	touch $@

# Resolve the extras afresh in a scratch venv and pin what came out (torch aside: the line above installs
# it). Run `make test` on the new pins before committing them.
LOCK_VENV := .venv-lock
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q "torch==2.13.0" && $(LOCK_VENV)/bin/pip install -q -e ".[all]"
	{ grep '^#' constraints.txt; $(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -v '^torch=='; } > constraints.new
	mv constraints.new constraints.txt && rm -rf $(LOCK_VENV)

# The suite on the newest releases pyproject.toml's ranges allow, in a scratch venv (not part of `make test`):
# run it before `make lock`, so that new pins are known to pass.
LATEST_VENV := .venv-latest
test-latest: redis-server
	rm -rf $(LATEST_VENV) && $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install -q "torch==2.13.0" && $(LATEST_VENV)/bin/pip install -q -e ".[all]"
	$(LATEST_VENV)/bin/pip list 2>/dev/null | grep -iE '^(transformers|kernels|torch|llguidance) '
	$(LATEST_VENV)/bin/pytest $(PYTEST_JOBS); status=$$?; rm -rf $(LATEST_VENV); exit $$status

demo: $(DEMO_STAMP)
	$(VENV)/bin/hypic-rag demo

# The Redis tier's tests start a real redis-server (the Debian package) on loopback.
redis-server:
	@command -v redis-server >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q redis-server; \
		else sudo apt-get install -y -q redis-server; fi; }

# --durations: every run ends with its 30 slowest tests, so a test that grew is seen where it grew.
test: $(STAMP) redis-server
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest $(PYTEST_JOBS) --durations=30

# The inner loop: everything but the slow tiers (pyproject.toml's markers); `make test` runs them all.
FAST := not (ray or training or bench or standard or docs or wheel)
test-fast: $(STAMP) redis-server
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest $(PYTEST_JOBS) -m "$(FAST)" --durations=10

bench: $(STAMP)
	$(VENV)/bin/hypic-rag bench --runtime --json bench-runtime.json
	$(VENV)/bin/hypic-rag bench --json bench-ttft.json
	$(VENV)/bin/hypic-rag bench --slo --json bench-slo.json
	$(VENV)/bin/hypic-rag bench --server --json bench-server.json

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) $(LOCK_VENV) $(LATEST_VENV) build *.egg-info
