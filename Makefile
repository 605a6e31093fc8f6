# Two entry points: `make demo` (main job on real data) and `make test`.
# Both create .venv and install everything on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) pipelines/demo.py

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/loader.py
	$(PY) benchmarks/model.py
	$(PY) benchmarks/ddp.py

clean:
	rm -rf $(VENV) demo_out .pytest_cache
