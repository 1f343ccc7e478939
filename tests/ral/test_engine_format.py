"""Saved engines whose code is corrupted never crash: they fall back, or raise clearly."""
import zipfile

import pytest
import torch

import blade
from helpers import assert_same


class Chain(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2.0 + 1.0


def save_with_flipped_code(tmp_path, config):
    x = torch.randn(4, 8)
    path = tmp_path / "model.pt"
    torch.jit.save(blade.optimize(Chain(), (x,), config), str(path))
    corrupted = tmp_path / "corrupted.pt"
    flipped = 0
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(corrupted, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if data.startswith(b"\x7fELF"):  # the engine's shared library
                middle = len(data) // 2
                data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 16]) + \
                    data[middle + 16:]
                flipped += 1
            dst.writestr(item, data)
    assert flipped == 1
    return corrupted, x


def test_flipped_code_bytes_fall_back_and_report_why(tmp_path):
    path, x = save_with_flipped_code(tmp_path, None)
    loaded = torch.jit.load(str(path))
    assert_same(loaded(x), Chain()(x))
    cluster = blade.report(loaded).clusters[0]
    assert cluster.fallbacks == 1
    assert "checksum" in cluster.status


def test_flipped_code_bytes_raise_in_error_mode(tmp_path):
    path, _ = save_with_flipped_code(tmp_path, blade.Config(fallback="error"))
    with pytest.raises(RuntimeError, match="fails its checksum"):
        torch.jit.load(str(path))
