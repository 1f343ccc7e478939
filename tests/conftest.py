import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# The tests import shared helpers from this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Engines are signed with this machine's key, kept under $XDG_CONFIG_HOME (docs/security.md):
# the tests sign with a key of their own, in a directory that lives as long as the run,
# and every process they start inherits it.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="blade-tests-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], True)

# Under pytest-xdist (`make test`: two workers on two cores) each worker runs PyTorch and
# oneDNN on one thread: two threads each would spin on the other worker's core. Tests of
# threading set their thread counts themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Compiled code is cached across optimize calls (blade.codegen.cache): tests compile afresh,
# so that one test's code never stands in for another's; tests/codegen/test_compile_cache.py names
# its own directories.
os.environ["BLADE_CACHE_DIR"] = "off"

# Tests that take tens of seconds each (C++ builds, Ray Serve replicas, processes racing on
# one cache, the documents' walkthroughs, the largest compiles): `make test` leaves them to
# `make test-slow`, which CI runs too (.ci/run). Matched by the start of their node id.
SLOW = (
    "test_docs.py::test_code_blocks_run[deployment.md]",
    "test_docs.py::test_code_blocks_run[user_guide.md]",
    "test_serve_example.py::",
    "test_cpp_example.py::",
    "ral/test_ral_cpp.py::",
    "codegen/test_compile_cache.py::test_two_processes_optimizing_at_once_both_succeed",
    "codegen/test_compile_cache.py::test_a_process_whose_code_all_comes_from_the_cache_never",
    "codegen/test_compile_cache.py::test_entry_signed_by_a_foreign_key_is_rebuilt",
    "converters/test_layout.py::test_adaptive_pools_of_any_size_compile_whole",
    "converters/test_attention.py::test_dynamic_attention_of_zero_length_sequences",
    "test_cli.py::test_user_errors_are_one_line_with_status_2",
    "passes/test_cluster.py::test_twenty_thousand_node_graph_clusters",
)


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent
    for item in items:
        node = Path(str(item.fspath)).relative_to(tests).as_posix() + "::" + item.name
        if node.startswith(SLOW):
            item.add_marker("slow")
