# Two commands on a fresh machine:  make demo   |   make test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SOURCES := setup.cfg pyproject.toml $(shell find ptnative c_code -name '*.py' -o -name '*.h' -o -name '*.cu' -o -name '*.c' -o -name '*.cc')

.PHONY: demo test bench info clean gpu-check matrix test-env wheel test-aarch64 cross-aarch64 print-matrix-tests

$(VENV)/.installed: $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet ".[test]"
	touch $@

# Set up (venv + a regular, non-editable install) and run a short program using a native op.
demo: $(VENV)/.installed
	cd $(VENV) && ./bin/python -m ptnative demo

# Set up and run the tests against the installed package (import mode importlib: not the checkout's sources), in
# PYTEST_JOBS processes (pytest-xdist, a test extra; default: one per core; 0 runs them in this process).
PYTEST_JOBS ?= auto
test: $(VENV)/.installed
	$(VENV)/bin/pytest --import-mode=importlib -q -p no:cacheprovider -n $(PYTEST_JOBS) tests $(PYTEST_ARGS)

# Every benchmark in bench/, then docs/performance.md and docs/img/performance.png from their rows (bench/report.py).
# BENCH_ARGS=--quick: short settings.  Peers (torch, jax, dynamax, hmmlearn, ...) are timed where installed in the
# venv (VENV=... names another one); missing ones are listed as not installed.
bench: $(VENV)/.installed
	$(PY) bench/report.py $(BENCH_ARGS)

# A wheel for other machines of this architecture (docs/install.md, "A wheel for other machines"): its prebuilt
# kernels are built once per portable CPU level of the architecture (ptnative/cpu_levels.py; x86-64: x86-64-v4 with
# AVX-512, x86-64-v3 with AVX2, x86-64-v2; aarch64: armv8.2-a, armv8-a) instead of for -march=native, recorded in
# ptnative/prebuilt/toolchain.json, so installing it compiles nothing where the user sets no PTNATIVE_CXXFLAGS, and
# each machine loads the best level its CPU runs.  WHEEL_CXXFLAGS=... builds one level with those flags instead.
# Built in pip's isolated build environment (as `pip install .` builds), into $(DIST); the kernels' progress lines
# are shown, pip's whole log is kept there.
ARCH := $(shell uname -m)
WHEEL_CXXFLAGS ?=
WHEEL_ENV := $(if $(WHEEL_CXXFLAGS),PTNATIVE_CXXFLAGS="$(WHEEL_CXXFLAGS)",PTNATIVE_PREBUILT_LEVELS=portable)
DIST ?= dist
wheel: $(VENV)/.installed
	@if [ -z "$(WHEEL_CXXFLAGS)" ] && [ -z "$(filter x86_64 amd64 aarch64 arm64,$(ARCH))" ]; then \
		echo "no portable CPU levels known for $(ARCH): set WHEEL_CXXFLAGS"; exit 1; fi
	rm -rf build $(DIST)/.failed && mkdir -p $(DIST)
	($(WHEEL_ENV) $(PY) -m pip wheel --no-deps -v -w $(DIST) . \
		|| touch $(DIST)/.failed) 2>&1 | tee $(DIST)/wheel-build.log \
		| grep --line-buffered -E '^ *(ptnative:|\[[0-9]+/[0-9]+\])|Stored in|Successfully built|ERROR'
	@if [ -e $(DIST)/.failed ]; then rm $(DIST)/.failed; echo "make wheel failed: see $(DIST)/wheel-build.log"; exit 1; fi

info: $(VENV)/.installed
	cd $(VENV) && ./bin/python -m ptnative info

# On a GPU machine (no venv, no network; wheels from scripts/gpu_wheels.sh in .whl/): setup, info, builds,
# tests/gpu and bench/gpu.py, into a report (GPU_REPORT, default $OUT/gpu_report.txt or gpu_report.txt).  docs/gpu.md
gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh $(GPU_REPORT)

# ---- The supported matrix (README, "Supported versions"; docs/compat.md).
# `make matrix` builds each environment from scratch under $(ENVS): the host stack first (what a user has before
# ptnative: PyMC 5.28 on Python 3.11 brings PyTensor 2.38, PyMC 6.4 on 3.12 brings PyTensor 3.3 and numba 0.68;
# nothing on 3.13, where pip picks the newest PyTensor), then ptnative with its test extras, checked by
# scripts/check_no_downgrade.py (nothing of the host may move), then MATRIX_TESTS against the installed package.
# An interpreter that is not found is skipped with a message (PY311=... PY312=... PY313=... name them).
ENVS ?= .envs
find_python = $(shell for p in python$(1) $(HOME)/.pyenv/versions/$(1).*/bin/python$(1); do \
	$$p -c 'import sys; assert sys.version_info[:2] == tuple(map(int, "$(1)".split(".")))' 2>/dev/null \
	&& { command -v $$p; break; }; done)
PY311 ?= $(call find_python,3.11)
PY312 ?= $(call find_python,3.12)
PY313 ?= $(call find_python,3.13)
# The generic machinery, the compatibility checks, one every-mode reference test per op family, and ptnative.eager.
MATRIX_TESTS := tests/test_native_op.py tests/test_generated_code.py tests/test_compat.py \
	tests/test_lstm.py::test_forward_and_gradients_against_reference \
	tests/test_fsa.py::test_fast_bw_against_references \
	tests/test_rnnt.py::test_modes_agree \
	tests/test_edit_distance.py::test_against_reference_all_modes \
	tests/test_chunking.py::test_forward_and_gradients_against_reference \
	tests/test_sparse.py::test_crossentropy_softmax_sparse tests/test_blas_threads.py tests/test_eager.py
# The PyMC tests (the example's short sampling run, and the HMM helpers of ptnative.pymc with ArviZ < 1 and >= 1;
# where PyMC is installed), in a session of their own: they import PyMC when collected, and MATRIX_TESTS must also
# run before `import pymc`.
MATRIX_PYMC_TESTS := tests/test_pymc.py tests/test_pymc_hmm.py tests/test_pymc_hsmm.py

matrix:
	$(MAKE) test-env ENV=$(ENVS)/py311-pt238 PYTHON="$(PY311)" HOST="pymc==5.28.*"
	$(MAKE) test-env ENV=$(ENVS)/py312-pymc6-clang PYTHON="$(PY312)" HOST="pymc==6.4.*" ROW_CXX=clang++
	$(MAKE) test-env ENV=$(ENVS)/py313 PYTHON="$(PY313)" HOST=

# One environment: ENV (a folder, recreated), PYTHON (its interpreter), HOST (pip requirements installed first),
# ROW_CXX (optional: the C++ compiler that builds ptnative's kernels, PTNATIVE_CXX; the PyMC 6 row uses clang++, the
# compiler of PyMC's macOS users).
# Its install skips the prebuilt kernels (PTNATIVE_PREBUILD, default 0 here): the rows share one kernel cache, where
# each kernel they use is compiled once for all of them (or was put by `make test`).  Its tests compile PyTensor's
# C modules with PyTensor's own flags (PTNATIVE_TEST_PYTENSOR_DEFAULTS=1; `make test` drops its -O3 and -g, see
# tests/conftest.py), so each row also tests the "C" mode as users build it.
test-env:
	@if [ -z "$(PYTHON)" ]; then echo "SKIPPED $(ENV): no interpreter found (set PYTHON)"; exit 0; fi; \
	if [ -n "$(ROW_CXX)" ] && ! command -v $(ROW_CXX) >/dev/null; then echo "SKIPPED $(ENV): no $(ROW_CXX)"; exit 0; fi; \
	set -e; start=$$(date +%s); rm -rf $(ENV); \
	if [ -n "$(ROW_CXX)" ]; then export PTNATIVE_CXX=$(ROW_CXX); echo "$(ENV): kernels built by $(ROW_CXX)"; fi; \
	PTNATIVE_PREBUILD=$${PTNATIVE_PREBUILD:-0} $(PYTHON) scripts/check_no_downgrade.py --venv $(ENV) --python $(PYTHON) \
		$(foreach h,$(HOST),--host '$(h)') --install ".[test]"; \
	$(ENV)/bin/python -c 'import pytensor, sys; print("$(ENV): Python", sys.version.split()[0], "pytensor", pytensor.__version__)'; \
	PTNATIVE_TEST_PYTENSOR_DEFAULTS=1 $(ENV)/bin/pytest --import-mode=importlib -q -p no:cacheprovider $(MATRIX_TESTS) \
		$(PYTEST_ARGS); \
	if $(ENV)/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("pymc") is None)'; then \
		PTNATIVE_TEST_PYTENSOR_DEFAULTS=1 $(ENV)/bin/pytest --import-mode=importlib -q -p no:cacheprovider \
			$(MATRIX_PYMC_TESTS) $(PYTEST_ARGS); \
	else echo "$(ENV): no PyMC, $(MATRIX_PYMC_TESTS) not run"; fi; \
	echo "$(ENV): created and tested in $$(( $$(date +%s) - start )) s"

print-matrix-tests:
	@echo $(MATRIX_TESTS)

# ---- aarch64 (docs/install.md, "aarch64").  `make cross-aarch64`: every catalogue library cross-compiled with
# aarch64-linux-gnu-g++ (-march=armv8.2-a), nothing run (CI runs it).  `make test-aarch64` (root): an emulated arm64
# Debian (qemu-user-static, mmdebstrap; kept in .aarch64/) where ptnative is installed, its kernels compiled by the
# aarch64 g++, and the generic-op tests, MATRIX_TESTS and HMM and CTC tests are run: a release check.
cross-aarch64: $(VENV)/.installed
	$(PY) scripts/cross_build.py -j $(CROSS_JOBS)
CROSS_JOBS ?= $(shell nproc)

test-aarch64:
	bash scripts/test_aarch64.sh

clean:
	rm -rf $(VENV) $(ENVS) build *.egg-info
