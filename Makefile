# Two commands on a fresh machine:  make demo   |   make test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SOURCES := setup.cfg pyproject.toml $(shell find ptnative c_code -name '*.py' -o -name '*.h' -o -name '*.cu' -o -name '*.c' -o -name '*.cc')

.PHONY: demo test bench info clean gpu-check

$(VENV)/.installed: $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet ".[test]"
	touch $@

# Set up (venv + a regular, non-editable install) and run a short program using a native op.
demo: $(VENV)/.installed
	cd $(VENV) && ./bin/python -m ptnative demo

# Set up and run the tests against the installed package (import mode importlib: not the checkout's sources).
test: $(VENV)/.installed
	$(VENV)/bin/pytest --import-mode=importlib -q -p no:cacheprovider tests $(PYTEST_ARGS)

bench: $(VENV)/.installed
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

info: $(VENV)/.installed
	cd $(VENV) && ./bin/python -m ptnative info

# On a GPU machine (no venv, no network; wheels from scripts/gpu_wheels.sh in .whl/): setup, info, builds,
# tests/gpu and bench/gpu.py, into a report (GPU_REPORT, default $OUT/gpu_report.txt or gpu_report.txt).  docs/gpu.md
gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh $(GPU_REPORT)

clean:
	rm -rf $(VENV) build *.egg-info
