"""Saved models edited as an attacker would: no case runs foreign code or crashes the
process; each engine is refused with a clear reason and the model gives eager's results
through its TorchScript fallback (docs/security.md)."""
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import blade
from blade import _C
from helpers import assert_same
from saved_state import (CODE, GUARD_CLASS, FALLBACK_IR, INPUT_SPECS, META, MODE, NAME, OUTPUT_SPECS,
                         PARAMS, VERSION, PersistentId, byte_tensor, evil_library,
                         member_bytes, rewrite_engines)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)

    def forward(self, x):
        return torch.relu(self.fc(x)) * torch.sigmoid(x.sum(-1, True))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The model, an input, eager's output, and the optimized model saved."""
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 16)
    optimized = blade.optimize(model, (x,))
    assert blade.report(optimized).coverage == 1.0
    path = tmp_path_factory.mktemp("saved") / "model.pt"
    torch.jit.save(optimized, str(path))
    with torch.no_grad():
        expected = model(x)
    return path, x, expected


def replace_meta(state, key, value):
    lines = [line for line in state[META].splitlines() if not line.startswith(key + "=")]
    if value is not None:
        lines.append(f"{key}={value}")
    state[META] = "\n".join(lines) + "\n"
    return state


def new_code(state, members, data: bytes):
    members["9001"] = data
    state[CODE] = byte_tensor("9001", len(data))
    return state


def assert_refused(path, x, expected, reason, marker=None):
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        assert_same(loaded(x), expected)
    report = blade.report(loaded)
    (cluster,) = report.clusters
    assert cluster.fallbacks == 1 and cluster.calls == 1, str(report)
    assert reason in cluster.status, cluster.status
    if marker is not None:
        assert not marker.exists(), "the foreign library's code ran"


def test_saved_model_is_signed_by_this_machine_and_runs_compiled(saved):
    path, x, expected = saved
    loaded = torch.jit.load(str(path))
    engine = loaded.blade_engine_0
    assert engine.signature().startswith(f"ed25519:{blade.signing_public_key()}:")
    assert blade.signing_public_key() in blade.trusted_keys()
    assert_same(loaded(x), expected)
    assert blade.report(loaded).runtime_fallbacks == 0


def test_foreign_library_in_place_of_the_code_never_runs(saved, tmp_path):
    path, x, expected = saved
    marker = tmp_path / "pwned"
    evil = evil_library(tmp_path, marker)
    target = tmp_path / "evil.pt"
    assert rewrite_engines(path, target, lambda s, m: new_code(s, m, evil)) == 1
    assert_refused(target, x, expected, "does not match its contents", marker)


def test_foreign_library_with_the_old_checksum_recomputed_never_runs(saved, tmp_path):
    """What the FNV checksum of format 2 let through: the attacker recomputes it."""
    path, x, expected = saved
    marker = tmp_path / "pwned"
    evil = evil_library(tmp_path, marker)

    def fnv1a(data):
        h = 1469598103934665603
        for b in data:
            h = ((h ^ b) * 1099511628211) % 2 ** 64
        return h - 2 ** 64 if h >= 2 ** 63 else h

    def edit(state, members):
        state[VERSION] = 2
        replace_meta(state, "signature", None)
        replace_meta(state, "checksum", fnv1a(evil))
        return new_code(state, members, evil)

    target = tmp_path / "evil.pt"
    rewrite_engines(path, target, edit)
    assert_refused(target, x, expected, "format version 2", marker)


def sign_in_another_process(tmp_path, script: str) -> str:
    """Runs `script` as another machine would: its own config directory, so its own key.
    Returns what it printed last (a public key)."""
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "attacker-config"))
    env.pop("BLADE_TRUSTED_KEYS", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()[-1]


def test_foreign_library_signed_by_an_untrusted_key_never_runs(saved, tmp_path):
    path, x, expected = saved
    marker = tmp_path / "pwned"
    evil_path = tmp_path / "evil.bin"
    evil_path.write_bytes(evil_library(tmp_path, marker))
    target = tmp_path / "evil.pt"
    tests_ral = Path(__file__).resolve().parent
    key = sign_in_another_process(tmp_path, textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tests_ral)!r})
        import torch, blade
        from blade import _C
        from saved_state import *
        evil = open({str(evil_path)!r}, "rb").read()
        def edit(state, members):
            members["9001"] = evil
            state[CODE] = byte_tensor("9001", len(evil))
            code = torch.frombuffer(bytearray(evil), dtype=torch.uint8)
            features = dict(l.split("=", 1) for l in state[META].splitlines())["cpu_features"]
            params = torch.jit.load({str(path)!r}).blade_engine_0.__getstate__()[0][4]
            signature = _C.sign_engine(state[NAME], code, state[INPUT_SPECS],
                                       state[OUTPUT_SPECS], state[FALLBACK_IR], params,
                                       state[MODE], features, "")
            lines = [l for l in state[META].splitlines() if not l.startswith("signature=")]
            state[META] = "\\n".join(lines + ["signature=" + signature]) + "\\n"
            return state
        rewrite_engines({str(path)!r}, {str(target)!r}, edit)
        print(blade.signing_public_key())
    """))
    assert key not in blade.trusted_keys()
    assert_refused(target, x, expected, f"signed by key {key}, which this process does not "
                   "trust", marker)


def test_model_signed_elsewhere_runs_once_its_key_is_trusted(saved, tmp_path):
    path, x, expected = saved
    target = tmp_path / "foreign.pt"
    key = sign_in_another_process(tmp_path, textwrap.dedent(f"""
        import torch, blade
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).eval()
        torch.jit.save(blade.optimize(model, (torch.randn(4, 16),)), {str(target)!r})
        torch.save(model, {str(tmp_path / "eager.pt")!r})
        print(blade.signing_public_key())
    """))
    model = torch.load(str(tmp_path / "eager.pt"), weights_only=False)
    with torch.no_grad():
        expected = model(x)
    # Untrusted: the fallback runs, and the reason names the key and how to trust it.
    assert_refused(target, x, expected, f'blade.trust_key("{key}")')
    # Trusted through the environment, in a new process.
    check = textwrap.dedent(f"""
        import torch, blade
        loaded = torch.jit.load({str(target)!r})
        loaded(torch.randn(4, 16))
        print(blade.report(loaded).clusters[0].status or "compiled",
              blade.report(loaded).runtime_fallbacks)
    """)
    env = dict(os.environ, BLADE_TRUSTED_KEYS=f"not-a-key, {key}")
    run = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                         text=True, check=True)
    assert run.stdout.split()[-2:] == ["compiled", "0"], run.stdout + run.stderr
    assert "lists 'not-a-key', which is neither a public key" in run.stderr
    # Trusted through the API, in this process, after the model was loaded: its engine
    # loads its code on its next call.
    loaded = torch.jit.load(str(target))
    with torch.no_grad():
        assert_same(loaded(x), expected)
    assert blade.report(loaded).runtime_fallbacks == 1
    blade.trust_key(key)
    with torch.no_grad():
        assert_same(loaded(x), expected)
    report = blade.report(loaded)
    assert report.runtime_fallbacks == 1 and report.running_ops == report.total_ops, str(report)
    assert loaded.blade_engine_0.load_error() == "" and loaded.blade_engine_0.is_compiled()
    loaded = torch.jit.load(str(target))
    with torch.no_grad():
        assert_same(loaded(x), expected)
    assert blade.report(loaded).runtime_fallbacks == 0


def test_malformed_trusted_key_is_refused():
    with pytest.raises(RuntimeError, match="64 hex digits"):
        blade.trust_key("abc")


def other_engine_code(tmp_path) -> bytes:
    """The code of another model's engine (a real Blade library, signed by this machine)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh()).eval()
    path = tmp_path / "other.pt"
    torch.jit.save(blade.optimize(model, (torch.randn(4, 16),)), str(path))
    found = []
    rewrite_engines(path, tmp_path / "unused.pt",
                    lambda s, m: found.append(member_bytes(path, s[CODE])))
    return found[0]


# Each edit of one field, and the reason the runtime gives for refusing the engine.
FIELD_EDITS = {
    "input spec made dynamic": (lambda s, m: s.__setitem__(INPUT_SPECS, "float32[?,16]"),
                                "does not match its contents"),
    "input spec symbol": (lambda s, m: s.__setitem__(INPUT_SPECS, "float32[s0,16]"),
                          "does not match its contents"),
    "input spec huge symbol": (lambda s, m: s.__setitem__(INPUT_SPECS, "float32[s999999999,16]"),
                               "malformed tensor spec"),
    "input spec any": (lambda s, m: s.__setitem__(INPUT_SPECS, "*"), "compiled code cannot take"),
    "input spec garbage": (lambda s, m: s.__setitem__(INPUT_SPECS, "float32[4,16"),
                           "malformed tensor spec"),
    "input spec unknown dtype": (lambda s, m: s.__setitem__(INPUT_SPECS, "complex64[4,16]"),
                                 "unknown dtype"),
    "input spec huge size": (lambda s, m: s.__setitem__(INPUT_SPECS, "float32[99999999999999,16]"),
                             "malformed tensor spec"),
    "no inputs": (lambda s, m: s.__setitem__(INPUT_SPECS, ""), "but its subgraph takes"),
    "no outputs": (lambda s, m: s.__setitem__(OUTPUT_SPECS, ""), "has no outputs"),
    "output spec shrunk": (lambda s, m: s.__setitem__(OUTPUT_SPECS, "float32[1,1]"),
                           "does not match its contents"),
    "extra output": (lambda s, m: s.__setitem__(OUTPUT_SPECS, s[OUTPUT_SPECS] + ";float32[4]"),
                     "does not match its contents"),
    "name": (lambda s, m: s.__setitem__(NAME, "blade_engine_7"), "does not match its contents"),
    "name not an identifier": (lambda s, m: s.__setitem__(NAME, "../../x" * 40),
                               "not an identifier"),
    "fallback mode garbage": (lambda s, m: s.__setitem__(MODE, "maybe"),
                              "neither 'fallback' nor 'error'"),
    "fallback IR reformatted": (lambda s, m: s.__setitem__(FALLBACK_IR, s[FALLBACK_IR] + "\n"),
                                "does not match its contents"),
    "cpu features cleared": (lambda s, m: replace_meta(s, "cpu_features", ""),
                             "does not match its contents"),
    "cpu features garbage": (lambda s, m: replace_meta(s, "cpu_features", "avx512f;rm -rf"),
                             "not a list of feature names"),
    "signature removed": (lambda s, m: replace_meta(s, "signature", None), "not signed"),
    "signature malformed": (lambda s, m: replace_meta(s, "signature", "ed25519:zz"),
                            "signature is malformed"),
    "signature of other bytes": (lambda s, m: replace_meta(
        s, "signature", "ed25519:" + blade.signing_public_key() + ":" + "ab" * 64),
        "does not match its contents"),
    "metadata key repeated": (lambda s, m: s.__setitem__(META, s[META] + "signature=x\n"),
                              "not a new key=value pair"),
    "metadata line without key": (lambda s, m: s.__setitem__(META, s[META] + "garbage\n"),
                                  "not a new key=value pair"),
    "format version": (lambda s, m: s.__setitem__(VERSION, 99), "format version 99"),
    "code truncated": (lambda s, m: new_code(s, m, member_bytes(m["source"], s[CODE])[:4096]),
                       "does not match its contents"),
    "code emptied": (lambda s, m: new_code(s, m, b""), "no compiled code"),
    "code bytes flipped": (lambda s, m: new_code(s, m, bytes(
        b ^ 0xFF for b in member_bytes(m["source"], s[CODE]))), "does not match its contents"),
    "code is a float tensor": (lambda s, m: s.__setitem__(CODE, s[PARAMS].args[0][0]),
                               "expected a 1-D uint8 tensor"),
    "another engine's code": (lambda s, m: new_code(s, m, m["other_code"]),
                              "does not match its contents"),
}


@pytest.mark.parametrize("case", sorted(FIELD_EDITS))
def test_every_field_edited_is_refused(saved, tmp_path, case):
    path, x, expected = saved
    edit, reason = FIELD_EDITS[case]
    extras = {"source": path}
    if case == "another engine's code":
        extras["other_code"] = other_engine_code(tmp_path)

    def apply(state, members):
        members.update(extras)
        edit(state, members)
        for key in extras:
            members.pop(key)
        return state

    target = tmp_path / "edited.pt"
    assert rewrite_engines(path, target, apply) == 1
    assert_refused(target, x, expected, reason)


def test_unknown_metadata_is_ignored(saved, tmp_path):
    """Metadata keys a later Blade may add (or the checksum of format 2) change nothing."""
    path, x, expected = saved
    target = tmp_path / "edited.pt"
    rewrite_engines(path, target, lambda s, m: replace_meta(s, "checksum", "abc"))
    loaded = torch.jit.load(str(target))
    with torch.no_grad():
        assert_same(loaded(x), expected)
    assert blade.report(loaded).runtime_fallbacks == 0


def zero_last_param(state, members):
    """Points the last param at a new archive member of zeros (same size and dtype)."""
    tensor = state[PARAMS].args[0][-1]
    kind, storage_type, _, device, numel = tensor.args[0].pid
    members["9002"] = bytes(4 * numel)
    tensor.args = (PersistentId((kind, storage_type, "9002", device, numel)),) + tensor.args[1:]
    return state


@pytest.mark.parametrize("edit", ["emptied", "swapped", "zeroed"])
def test_edited_params_refuse_the_code(saved, tmp_path, edit):
    """The params are the subgraph's weights too: the code is refused, and the subgraph
    runs with the weights as edited (or fails with a clear error when they are gone), as any
    TorchScript model whose weights were edited would."""
    path, x, expected = saved
    target = tmp_path / "edited.pt"
    change = {"emptied": lambda s, m: s[PARAMS].args[0].clear() or s,
              "swapped": lambda s, m: s[PARAMS].args[0].reverse() or s,
              "zeroed": zero_last_param}[edit]
    rewrite_engines(path, target, change)
    loaded = torch.jit.load(str(target))
    assert not loaded.blade_engine_0.is_compiled()
    reason = "subgraph takes 3 values" if edit == "emptied" else "does not match its contents"
    assert reason in loaded.blade_engine_0.load_error()
    if edit == "zeroed":
        with torch.no_grad():
            assert not torch.allclose(loaded(x), expected)
    else:
        with pytest.raises(RuntimeError):
            loaded(x)


def test_fallback_mode_edited_to_error_raises_at_load(saved, tmp_path):
    path, _, _ = saved
    target = tmp_path / "edited.pt"
    rewrite_engines(path, target, lambda s, m: s.__setitem__(MODE, "error") or s)
    with pytest.raises(RuntimeError, match="does not match its contents"):
        torch.jit.load(str(target))


def test_edited_field_raises_clearly_in_error_mode(tmp_path):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 16)
    path = tmp_path / "strict.pt"
    torch.jit.save(blade.optimize(model, (x,), blade.Config(fallback="error")), str(path))
    target = tmp_path / "edited.pt"
    rewrite_engines(path, target, lambda s, m: s.__setitem__(OUTPUT_SPECS, "float32[1,1]") or s)
    with pytest.raises(RuntimeError, match="does not match its contents"):
        torch.jit.load(str(target))


def test_unparsable_fallback_is_a_clear_load_error(saved, tmp_path):
    path, _, _ = saved
    target = tmp_path / "edited.pt"
    rewrite_engines(path, target, lambda s, m: s.__setitem__(FALLBACK_IR, "graph(") or s)
    with pytest.raises(RuntimeError, match="TorchScript subgraph does not parse"):
        torch.jit.load(str(target))


def test_truncated_files_are_load_errors(saved, tmp_path):
    path, x, expected = saved
    data = path.read_bytes()
    for cut in (len(data) // 3, len(data) - 100):
        target = tmp_path / f"cut{cut}.pt"
        target.write_bytes(data[:cut])
        with pytest.raises(RuntimeError):
            torch.jit.load(str(target))
    # Every member of the archive cut in half in turn: the loader refuses the file, or the
    # engine refuses its code (PyTorch's loader reads a cut tensor member without complaint,
    # so a cut weight gives other results, as it would in any TorchScript model).
    with zipfile.ZipFile(path) as src:
        names = src.namelist()
    for name in names:
        target = tmp_path / "member.pt"
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(target, "w") as dst:
            for item in src.infolist():
                content = src.read(item.filename)
                dst.writestr(item, content[:len(content) // 2] if item.filename == name
                             else content)
        try:
            loaded = torch.jit.load(str(target))
        except RuntimeError:
            continue
        if "/data/" in name:
            assert not loaded.blade_engine_0.is_compiled(), name
        else:
            with torch.no_grad():
                assert_same(loaded(x), expected)


def test_constructor_reachable_from_torchscript_refuses_unsigned_code(tmp_path):
    """A model file's own code can construct an Engine (torch.classes are scriptable): it
    cannot sign, so the code it brings is never loaded."""
    marker = tmp_path / "pwned"
    evil = evil_library(tmp_path, marker)
    engine = torch.classes.blade.Engine(
        "evil", torch.frombuffer(bytearray(evil), dtype=torch.uint8), "float32[4]",
        "float32[4]", "graph(%x : Tensor):\n  return (%x)\n", [], "fallback", "", "",
        "float32")
    assert not engine.is_compiled() and "not signed" in engine.load_error()
    assert not marker.exists()
    assert not hasattr(torch.ops.blade, "trust_public_key")
    assert not hasattr(torch.ops.blade, "sign_engine")
    assert _C.ENGINE_FORMAT_VERSION == 3


def test_edited_input_guard_is_a_load_error_or_harmless(saved, tmp_path):
    """The guard only chooses between the specialized and the unspecialized graph, like the
    graph itself it is not signed (docs/security.md): an edit may change which graph runs,
    never which native code runs, since each engine checks its own inputs."""
    path, x, expected = saved
    target = tmp_path / "edited.pt"
    assert rewrite_engines(path, target, lambda s, m: s.__setitem__(1, "float32[s999999999,16]")
                           or s, GUARD_CLASS) == 1
    with pytest.raises(RuntimeError, match="malformed tensor spec"):
        torch.jit.load(str(target))
    rewrite_engines(path, target, lambda s, m: s.__setitem__(1, "*") or s, GUARD_CLASS)
    loaded = torch.jit.load(str(target))
    with torch.no_grad():
        assert_same(loaded(x), expected)
        other = torch.randn(3, 16)
        assert_same(loaded(other), torch.jit.load(str(path))(other))
