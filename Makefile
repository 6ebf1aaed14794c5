# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv through `make install` when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed
# The torch release installed when none is importable. On the CI / dev machines a CPU build of this
# release lies on disk; elsewhere pip fetches the platform's default build (CUDA on Linux x86-64).
TORCH_VERSION ?= 2.13.0

.PHONY: install test demo bench clean

install: $(STAMP)

# torch is never downloaded when one is importable: a venv made from an interpreter that has torch
# sees it (--system-site-packages), and that torch satisfies the project's range.
$(STAMP): pyproject.toml
	@if $(PYTHON) -c "import torch" >/dev/null 2>&1; then \
	    echo "install: reusing the torch importable from $(PYTHON)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	    $(PYTHON) -m venv $(VENV); \
	fi
	@if ! $(PY) -c "import torch" >/dev/null 2>&1; then \
	    echo "install: no torch importable; installing torch==$(TORCH_VERSION)"; \
	    $(PIP) install -q "torch==$(TORCH_VERSION)"; \
	fi
	$(PIP) install -q -e ".[test]"
	$(PY) -c "import torch, hybrid, hybrid.kernels, hybrid.models, hybrid.train; print('install: ok, torch', torch.__version__)"
	@touch $(STAMP)

# `make test` spreads the tests over one pytest-xdist worker per CPU, at most 8 (a worker holds ~1 GB);
# TEST_WORKERS=0 runs them in this one process. Each worker takes its share of the CPUs (tests/conftest.py).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(8, os.cpu_count() or 1))")

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

demo: $(STAMP)
	$(PY) -m hybrid.train.demo

bench: $(STAMP)
	$(PY) -m hybrid.train.bench.scan

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
