"""Measurements that need a fresh process (imports, compile cache, load time, memory): the
code to run there, after the common preamble, and a runner that returns what it printed."""
import os
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
    """Runs PREAMBLE + `code` in a new interpreter; its stdout, or an error with its stderr.
    The child keeps Python's bytecode cache, as a user's interpreter does: where the
    environment forbids writing it (PYTHONDONTWRITEBYTECODE, as on the machines these
    benchmarks ran on), every child compiled Blade's sources again, 0.06-0.1 s of each
    optimize measured that no user pays twice."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-c", PREAMBLE + code], capture_output=True,
                          text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return done.stdout
