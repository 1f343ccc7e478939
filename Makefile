# Two entry points for a fresh machine: `make demo` and `make test`. Both set up .venv,
# install the pinned dependencies, build the C++ and then do their job.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-installed

.PHONY: setup build demo lint test test-slow bench test-asan serve-example clean

setup: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt | $(PY)
	# OpenSSL 3's headers: the runtime signs and verifies engine code with libcrypto.
	@test -f /usr/include/openssl/evp.h || ! command -v apt-get >/dev/null || \
	  [ "$$(id -u)" != 0 ] || { apt-get update -qq && apt-get install -y -qq libssl-dev; }
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and alone: any other request would pull a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements.txt
	# torchao, for the tests of PT2E-quantized models (it depends on torch: --no-deps).
	$(PY) -m pip install --quiet --no-deps torchao==0.18.0
	touch $@

# setup.py drives CMake; the build directory is kept so rebuilds are incremental.
build: $(DEPS_STAMP)
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .

demo: build
	$(PY) examples/quickstart.py

# Ray Serve, for examples/serve and its test (tests/test_serve_example.py).
SERVE_STAMP := $(VENV)/.serve-deps-installed
$(SERVE_STAMP): examples/serve/requirements.txt $(DEPS_STAMP)
	$(PY) -m pip install --quiet -r examples/serve/requirements.txt
	touch $@

# The layers of python/blade import only downward (.importlinter), and ruff finds nothing
# (ruff.toml).
lint: $(DEPS_STAMP)
	$(VENV)/bin/ruff check python tests benchmarks examples
	cd python && ../$(VENV)/bin/lint-imports --config ../.importlinter --no-cache

# The suite on both cores (pytest-xdist), but for the slow tests (tests/conftest.py, SLOW),
# which test-slow runs; CI runs both (.ci/run).
test: build lint
	$(PY) -m pytest -q -n 2 -m "not slow" tests

test-slow: build $(SERVE_STAMP)
	$(PY) -m pytest -q -n 2 -m slow tests

serve-example: build $(SERVE_STAMP)
	$(PY) examples/serve/ray_serve.py

# The peers (ONNX Runtime, OpenVINO, onnx for the export, NNCF and torchao for their int8),
# for benchmarks/peers.py. torchao depends on torch: --no-deps keeps the CPU build.
BENCH_STAMP := $(VENV)/.bench-deps-installed
$(BENCH_STAMP): benchmarks/requirements.txt $(DEPS_STAMP)
	$(PY) -m pip install --quiet -r benchmarks/requirements.txt
	$(PY) -m pip install --quiet --no-deps torchao==0.18.0
	touch $@

bench: build $(BENCH_STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/compile_time.py
	$(PY) benchmarks/load_time.py
	$(PY) benchmarks/footprint.py
	$(PY) benchmarks/decode.py
	$(PY) benchmarks/lengths.py --breakdown
	$(PY) benchmarks/layers.py --workload resnet50 --precision int8

# The runtime's C++ tests (tests/ral/ral_tests.cpp) with the runtime and the tests built
# under AddressSanitizer + LeakSanitizer, against models saved by the regular build.
ASAN_DIR := build/asan
test-asan: build
	$(VENV)/bin/cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DBLADE_ASAN=ON -DBLADE_BUILD_PYTHON=OFF -DBLADE_BUILD_TESTS=ON \
	  -DBLADE_OUTPUT_DIR=$(abspath $(ASAN_DIR))/out \
	  -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')"
	$(VENV)/bin/cmake --build $(ASAN_DIR) -j2
	$(PY) tests/ral/make_fixtures.py $(ASAN_DIR)/fixtures
	ASAN_OPTIONS=detect_leaks=1 $(ASAN_DIR)/out/ral_tests $(ASAN_DIR)/fixtures

clean:
	rm -rf build python/blade/*.so python/blade/lib*.so* *.egg-info python/*.egg-info
