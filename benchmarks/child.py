"""Measurements that need a fresh process (imports, compile cache, load time, memory): the
code to run there, after the common preamble, and a runner that returns what it printed."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCHSCRIPT_DEPRECATION = r"`torch\.jit\.\w+` is deprecated"

# What every child starts with: the workloads importable, TorchScript's deprecation notices
# silenced, torch on the benchmarks' 2 threads. (No braces: children `.format` their code.)
PREAMBLE = f"""import json, resource, sys, time, warnings
sys.path.insert(0, {str(HERE)!r})
warnings.filterwarnings("ignore", message={TORCHSCRIPT_DEPRECATION!r})
import torch
torch.set_num_threads(2)
"""


def run_child(code: str) -> str:
    """Runs PREAMBLE + `code` in a new interpreter; its stdout, or an error with its stderr."""
    done = subprocess.run([sys.executable, "-c", PREAMBLE + code], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return done.stdout
