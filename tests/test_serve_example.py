"""examples/serve/ray_serve.py end to end: a saved Blade model served by two Ray Serve
replicas on 127.0.0.1, bounded requests, answers equal to eager, engines counted in both
replicas; and replicas not given the signing key refuse the engines' code and fall back."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "serve" / "ray_serve.py"


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
def test_ray_serve_example(tmp_path, trusted):
    pytest.importorskip("ray.serve", reason="installed by `make test` from "
                                            "examples/serve/requirements.txt")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    command = [sys.executable, str(EXAMPLE), "--requests", "12", "--workdir", str(tmp_path)]
    run = subprocess.run(command + ([] if trusted else ["--untrusted"]), capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "OK" in lines and "FAILED" not in lines, run.stdout
    replicas = [line for line in lines if line.startswith("replica ")]
    assert len(replicas) == 2, run.stdout
    if trusted:
        assert all("fallbacks 0, load errors none" in line for line in replicas), run.stdout
    else:
        assert all("which this process does not trust" in line for line in replicas), \
            run.stdout
