"""What optimize shows while it works (Config.progress)."""
import torch

import blade
from blade.dump import Progress


def model():
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).eval()


def test_progress_shows_every_stage_then_the_clusters_with_elapsed_time(capsys):
    blade.optimize(model(), (torch.randn(4, 16),), blade.Config(progress=True, cache_dir="off"))
    lines = capsys.readouterr().err.splitlines()  # not a terminal: a line per step
    stages = [line.split("] ", 1)[1] for line in lines]
    assert stages[:5] == ["scripting...", "freezing...", "simplifying, recording types...",
                          "clustering...", "compiling clusters [" + "#" * 24 + "] 1/1 "
                          "blade_engine_0"], lines
    assert all(line.startswith("[blade ") and "s] " in line for line in lines)


def test_progress_is_quiet_under_pytest_by_default(capsys):
    assert not Progress.wanted(None)
    blade.optimize(model(), (torch.randn(4, 16),), blade.Config(cache_dir="off"))
    assert capsys.readouterr().err == ""
