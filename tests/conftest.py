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

# Compiled code is cached across optimize calls (blade.codegen.cache): tests compile afresh,
# so that one test's code never stands in for another's; tests/codegen/test_compile_cache.py names
# its own directories.
os.environ["BLADE_CACHE_DIR"] = "off"
