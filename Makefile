# The two set-up commands: `make demo` and `make test`.
# Both create (or refresh, when pyproject.toml changes) .venv from pyproject.toml.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/jaxsim-ncp demo
	$(VENV)/bin/jaxsim-ncp mpc configs/demo_pusher.toml --out out

test: $(STAMP)
	$(PY) -m pytest -n 2 -q --durations=15
