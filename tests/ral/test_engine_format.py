"""Saved engines whose code is corrupted never crash: they fall back, or raise clearly
(tests/ral/test_hostile_files.py edits every other field)."""
import pytest
import torch

import blade
from helpers import TanhChain, assert_same, flip_code_bytes, save_tampered


def save_with_flipped_code(tmp_path, config):
    path, x, changed = save_tampered(tmp_path, config, flip_code_bytes)
    assert changed == 1
    return path, x


def test_flipped_code_bytes_fall_back_and_report_why(tmp_path):
    path, x = save_with_flipped_code(tmp_path, None)
    loaded = torch.jit.load(str(path))
    assert_same(loaded(x), TanhChain()(x))
    cluster = blade.report(loaded).clusters[0]
    assert cluster.fallbacks == 1
    assert "signature does not match its contents" in cluster.status


def test_flipped_code_bytes_raise_in_error_mode(tmp_path):
    path, _ = save_with_flipped_code(tmp_path, blade.Config(fallback="error"))
    with pytest.raises(RuntimeError, match="signature does not match its contents"):
        torch.jit.load(str(path))
