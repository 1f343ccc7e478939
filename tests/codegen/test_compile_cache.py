"""Compiled code is reused: identical clusters share one compilation and one library in the
saved file, and a cache directory serves later optimize calls, in any process, only with
entries that verify (python/blade/codegen/cache.py)."""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import blade
from blade.report import CodeOrigin
from blade.codegen import driver as codegen
from blade.codegen.llvm.native import host_cpu_features
from helpers import assert_same, count_calls


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return torch.erfinv(torch.tanh(self.norm(self.fc(x))) * 0.5)  # erfinv: no converter


def layers(count=3, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[Layer() for _ in range(count)]).eval()


@pytest.fixture
def compilations(monkeypatch):
    """Counts the clusters code generation really compiles."""
    return count_calls(monkeypatch, codegen, "start_compiling")


def optimize_checked(model, x, config):
    # erfinv stays TorchScript, cutting the model into three clusters (as a kernel call it
    # would join them into one engine).
    optimized = blade.optimize(model, (x,), dataclasses.replace(config, kernel_calls=False))
    with torch.no_grad():
        assert_same(optimized(x), model(x))
    report = blade.report(optimized)
    assert len(report.clusters) == 3 and all(c.calls == 1 for c in report.clusters), str(report)
    assert report.runtime_fallbacks == 0 and not report.compile_errors, str(report)
    return optimized, report


def libraries_in(path: Path) -> int:
    with zipfile.ZipFile(path) as archive:
        return sum(archive.read(n).startswith(b"\x7fELF") for n in archive.namelist())


def test_identical_clusters_share_one_compilation_and_one_saved_library(tmp_path, compilations):
    model, x = layers(), torch.randn(4, 32)
    optimized, report = optimize_checked(model, x, blade.Config(cache_dir="off"))
    assert compilations["n"] == 1
    assert [(c.code, c.code_shared_with) for c in report.clusters] == [
        ("compiled", ""), ("shared", "blade_engine_0"), ("shared", "blade_engine_0")]
    assert report.clusters[1].code == CodeOrigin.SHARED
    assert "code: 1 compiled now, 0 from the compile cache; 2 engines of identical " \
        "clusters run another engine's code" in str(report)
    path = tmp_path / "model.pt"
    torch.jit.save(optimized, str(path))
    assert libraries_in(path) == 1
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        assert_same(loaded(x), model(x))  # distinct weights: params stay per engine
    assert blade.report(loaded).runtime_fallbacks == 0


def test_cache_hit_skips_codegen_and_gives_the_same_results(tmp_path, compilations):
    config = blade.Config(cache_dir=str(tmp_path / "cache"))
    x = torch.randn(4, 32)
    optimize_checked(layers(seed=0), x, config)
    assert compilations["n"] == 1
    # Other weights, same shapes: the same code, from the cache.
    _, report = optimize_checked(layers(seed=1), x, config)
    assert compilations["n"] == 1
    assert report.clusters[0].code == "compile cache"


def cache_entries(directory: Path):
    return sorted(directory.glob("*/*.code"))


@pytest.fixture
def comparisons(monkeypatch):
    """Counts the engines the engine check runs (blade.self_check.compare_engine)."""
    import blade.self_check

    return count_calls(monkeypatch, blade.self_check, "compare_engine")


def entry_header(entry: Path) -> dict:
    from blade.codegen.cache import _MAGIC

    data = entry.read_bytes()
    size = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 16
    return json.loads(data[start:start + size])


def test_code_checked_when_compiled_is_not_run_by_the_check_again(tmp_path, comparisons,
                                                                  monkeypatch):
    import blade.self_check

    captures = []
    real_capture = blade.self_check.capture_cluster_examples
    monkeypatch.setattr(blade.self_check, "capture_cluster_examples",
                        lambda *args: captures.append(args[2]) or real_capture(*args))
    config = blade.Config(cache_dir=str(tmp_path / "cache"))
    x = torch.randn(4, 32)
    _, report = optimize_checked(layers(seed=0), x, config)
    assert comparisons["n"] == 1 and report.checked_engines == 1 and captures
    (entry,) = cache_entries(tmp_path / "cache")
    assert entry_header(entry)["checked"] == ["float32"]
    # Other weights, the same code: from the cache, checked by the optimize above. No
    # example run is even prepared.
    captures.clear()
    _, report = optimize_checked(layers(seed=1), x, config)
    assert comparisons["n"] == 1 and captures == [], str(report)
    assert report.checked_engines == 0 and report.engines_checked_before == 1 and \
        report.engines_sharing_checked_code == 2, str(report)
    assert "1 engine runs cached code that was checked when it was compiled" in str(report)


def test_code_compiled_unchecked_is_checked_when_next_used(tmp_path, comparisons):
    config = blade.Config(cache_dir=str(tmp_path / "cache"))
    x = torch.randn(4, 32)
    optimize_checked(layers(), x, dataclasses.replace(config, check_engines=False))
    (entry,) = cache_entries(tmp_path / "cache")
    assert comparisons["n"] == 0 and entry_header(entry)["checked"] == []
    _, report = optimize_checked(layers(), x, config)
    assert comparisons["n"] == 1 and report.checked_engines == 1, str(report)
    assert report.clusters[0].code == "compile cache"
    assert entry_header(entry)["checked"] == ["float32"]


def test_an_entry_claiming_a_check_it_was_not_signed_with_is_rebuilt(tmp_path, compilations,
                                                                   comparisons):
    from blade.codegen.cache import _MAGIC

    config = blade.Config(cache_dir=str(tmp_path / "cache"))
    x = torch.randn(4, 32)
    optimize_checked(layers(), x, dataclasses.replace(config, check_engines=False))
    (entry,) = cache_entries(tmp_path / "cache")
    data = entry.read_bytes()
    header = entry_header(entry)
    old_size = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 8], "little")
    library_size = int.from_bytes(data[len(_MAGIC) + 8:len(_MAGIC) + 16], "little")
    header["checked"] = ["float32"]
    forged = json.dumps(header).encode()
    start = len(_MAGIC) + 16
    entry.write_bytes(_MAGIC + len(forged).to_bytes(8, "little") +
                      library_size.to_bytes(8, "little") + forged +
                      data[start + old_size:])  # the library and the old signature
    _, report = optimize_checked(layers(), x, config)
    assert compilations["n"] == 2 and report.clusters[0].code == "compiled"
    assert comparisons["n"] == 1 and report.checked_engines == 1, str(report)


@pytest.mark.skipif("avx512_bf16" not in host_cpu_features().split(","),
                    reason="this CPU lacks avx512_bf16")
def test_code_checked_in_float32_is_checked_again_in_bf16(tmp_path, comparisons):
    config = blade.Config(cache_dir=str(tmp_path / "cache"), kernel_calls=False)
    model, x = layers(), torch.randn(4, 32)
    blade.optimize(model, (x,), config)
    assert comparisons["n"] == 1
    # The same code (the key has no precision): its bf16 engine is checked on its own.
    optimized = blade.optimize(model, (x,), dataclasses.replace(config, precision="bf16"))
    report = blade.report(optimized)
    assert comparisons["n"] == 2 and report.checked_engines == 1, str(report)
    assert report.clusters[0].code == "compile cache" and not report.compile_errors
    (entry,) = cache_entries(tmp_path / "cache")
    assert entry_header(entry)["checked"] == ["float32", "bf16"]


@pytest.mark.parametrize("damage", ["flipped", "truncated", "garbage", "empty"])
def test_damaged_entry_is_rebuilt_never_loaded(tmp_path, compilations, damage):
    config = blade.Config(cache_dir=str(tmp_path / "cache"))
    x = torch.randn(4, 32)
    optimize_checked(layers(), x, config)
    (entry,) = cache_entries(tmp_path / "cache")
    data = entry.read_bytes()
    entry.write_bytes({"flipped": data[:200] + bytes([data[200] ^ 1]) + data[201:],
                       "truncated": data[:len(data) // 2],
                       "garbage": os.urandom(len(data)),
                       "empty": b""}[damage])
    _, report = optimize_checked(layers(), x, config)
    assert compilations["n"] == 2 and report.clusters[0].code == "compiled"
    # Rebuilt in its place, whole again.
    (entry,) = cache_entries(tmp_path / "cache")
    assert entry.read_bytes() != b"" and len(entry.read_bytes()) == len(data)
    optimize_checked(layers(), x, config)
    assert compilations["n"] == 2


def run_python(script: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                            env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


OPTIMIZE_LAYERS = f"""
    import sys, torch, blade
    sys.path[:0] = [{str(Path(__file__).resolve().parent)!r},
                    {str(Path(__file__).resolve().parent.parent)!r}]
    from test_compile_cache import layers
    x = torch.randn(4, 32)
    model = layers()
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir=sys.argv[1], kernel_calls=False))
    with torch.no_grad():
        torch.testing.assert_close(optimized(x), model(x))
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 0 and len(report.clusters) == 3, str(report)
    print(report.clusters[0].code)
"""


def test_entry_signed_by_a_foreign_key_is_rebuilt(tmp_path, compilations):
    cache = tmp_path / "cache"
    foreign = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OPTIMIZE_LAYERS), str(cache)],
        env=dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "elsewhere")),
        capture_output=True, text=True)
    assert foreign.returncode == 0, foreign.stderr
    assert foreign.stdout.split()[-1] == "compiled"
    _, report = optimize_checked(layers(), torch.randn(4, 32), blade.Config(cache_dir=str(cache)))
    assert compilations["n"] == 1 and report.clusters[0].code == "compiled"


def test_two_processes_optimizing_at_once_both_succeed(tmp_path):
    cache = tmp_path / "cache"
    script = textwrap.dedent(OPTIMIZE_LAYERS)
    runs = [subprocess.Popen([sys.executable, "-c", script, str(cache)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, out + err
        assert out.strip().splitlines()[-1:] in (["compiled"], ["compile cache"]), out + err
    entries = cache_entries(cache)
    assert len(entries) == 1, entries
    assert not list(cache.glob("*/.tmp-*")), list(cache.rglob("*"))


def test_a_process_whose_code_all_comes_from_the_cache_never_loads_mlir(tmp_path):
    cache = tmp_path / "cache"
    script = textwrap.dedent("""
        import sys, torch, blade
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()).eval()
        # (the model cache off: the code cache is what is tested, not the model cache)
        optimized = blade.optimize(model, (torch.randn(4, 32),),
                                   blade.Config(cache_dir=sys.argv[1], kernel_calls=False,
                                                cache_models=False))
        print(blade.report(optimized).clusters[0].code)
        print("torch_mlir" in sys.modules)
    """)
    for expected in (["compiled", "True"], ["compile cache", "False"]):
        run = subprocess.run([sys.executable, "-c", script, str(cache)], capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.strip().splitlines()[-2:] == expected, run.stdout + run.stderr


def test_cache_directory_stays_under_its_bound(tmp_path):
    cache = tmp_path / "cache"
    x = torch.randn(4, 32)
    # (code entries alone: tests/test_model_cache.py bounds model entries)
    optimize_checked(layers(), x, blade.Config(cache_dir=str(cache), cache_models=False))
    (entry,) = cache_entries(cache)
    bound = entry.stat().st_size * 3 // 2  # room for one entry, not two
    config = blade.Config(cache_dir=str(cache), cache_max_bytes=bound, cache_models=False)

    class Wider(Layer):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 32, bias=False)

    torch.manual_seed(0)
    wider = torch.nn.Sequential(*[Wider() for _ in range(3)]).eval()
    optimize_checked(wider, x, config)
    entries = cache_entries(cache)
    assert sum(e.stat().st_size for e in entries) <= bound
    assert len(entries) == 1 and entries[0] != entry  # the least recently used went


def test_cache_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("BLADE_CACHE_DIR", raising=False)
    optimize_checked(layers(), torch.randn(4, 32), blade.Config(cache_dir="off"))
    assert not (tmp_path / "xdg").exists()
    # By default the cache lives under XDG_CACHE_HOME.
    optimize_checked(layers(), torch.randn(4, 32), blade.Config())
    assert cache_entries(tmp_path / "xdg" / "blade" / "code")
    # The environment variable moves it (or turns it off).
    monkeypatch.setenv("BLADE_CACHE_DIR", str(tmp_path / "moved"))
    optimize_checked(layers(), torch.randn(4, 32), blade.Config())
    assert cache_entries(tmp_path / "moved")
