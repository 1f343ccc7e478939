# Two entry points for a fresh machine: `make demo` and `make test`. Both set up .venv,
# install the pinned dependencies, build the C++ and then do their job.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-installed

.PHONY: setup build demo test bench test-asan clean

setup: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and alone: any other request would pull a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# setup.py drives CMake; the build directory is kept so rebuilds are incremental.
build: $(DEPS_STAMP)
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .

demo: build
	$(PY) examples/quickstart.py

test: build
	$(PY) -m pytest -q tests

bench: build
	$(PY) benchmarks/run.py

clean:
	rm -rf build python/blade/*.so python/blade/lib*.so* *.egg-info python/*.egg-info
