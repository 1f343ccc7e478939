"""The command line: `blade optimize | report | bisect` on small saved models."""
import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blade
from blade.tools.cli import main, random_input
from helpers import TwoClusters, assert_same


WRONG_SIGMOID_PLUGIN = '''
import blade

@blade.register_converter("aten::sigmoid", priority=200)
def wrong_sigmoid(ctx):
    """Deliberately wrong, for `blade bisect` to find: x + x instead of sigmoid(x)."""
    x = ctx.operands[0]
    return ctx.op("stablehlo.add", [x, x])
'''


def blade_cli(*args, console_script=False):
    command = [str(Path(sys.executable).parent / "blade")] if console_script else \
        [sys.executable, "-m", "blade"]
    return subprocess.run(command + [str(a) for a in args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    torch.manual_seed(0)
    model = TwoClusters().eval()
    path = tmp_path_factory.mktemp("cli") / "model.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    return path, model


def test_optimize_saves_a_model_that_matches_eager(saved_model, tmp_path):
    path, model = saved_model
    out = tmp_path / "optimized.pt"
    # erfinv stays TorchScript between the two clusters (not a kernel call).
    run = blade_cli("optimize", path, "-o", out, "--input", "float32[4,8]",
                    "--no-kernel-calls", console_script=True)
    assert run.returncode == 0, run.stderr
    assert "s] scripting..." in run.stderr
    assert "s] compiling clusters [" in run.stderr and "2/2" in run.stderr
    assert "clusters: 2" in run.stdout and f"saved {out}" in run.stdout
    assert "DeprecationWarning" not in run.stderr
    loaded = torch.jit.load(str(out))
    x = torch.randn(4, 8)
    assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(loaded)
    assert len(report.clusters) == 2 and all(c.calls == 1 for c in report.clusters)
    assert report.runtime_fallbacks == 0


def test_optimize_with_inputs_from_a_file_and_report(saved_model, tmp_path):
    path, _ = saved_model
    torch.save([torch.randn(2, 8)], str(tmp_path / "inputs.pt"))
    out = tmp_path / "optimized.pt"
    run = blade_cli("optimize", path, "-o", out, "--inputs", tmp_path / "inputs.pt", "--quiet",
                    "--no-kernel-calls")
    assert run.returncode == 0, run.stderr
    assert "[blade " not in run.stderr

    run = blade_cli("report", out)
    assert run.returncode == 0, run.stderr
    assert "float32[2,8]" in run.stdout and "aten::erfinv" in run.stdout
    run = blade_cli("report", out, "--json")
    data = json.loads(run.stdout)
    assert data["compiled_ops"] > 0 and len(data["clusters"]) == 2


def test_user_errors_are_one_line_with_status_2(saved_model, tmp_path):
    path, _ = saved_model
    cases = [
        (("optimize", path, "-o", tmp_path / "o.pt", "--input", "float32[4,x]"),
         "--input 'float32[4,x]': expected dtype[d0,d1,...]"),
        (("optimize", path, "-o", tmp_path / "o.pt", "--input", "complex9[4]"),
         "unknown dtype 'complex9'"),
        (("optimize", path, "-o", tmp_path / "o.pt"), "example inputs are needed"),
        (("optimize", tmp_path / "missing.pt", "-o", tmp_path / "o.pt", "--input", "float32[1]"),
         "missing.pt: no such file"),
        (("report", path), "was not optimized by Blade"),
        (("bisect", path, "--input", "float32[4,8]", "--plugin", tmp_path / "nope.py"),
         "nope.py: no such file"),
    ]
    for args, message in cases:
        run = blade_cli(*args)
        assert run.returncode == 2, (args, run.stderr)
        assert message in run.stderr, (args, run.stderr)
        assert "Traceback" not in run.stderr, run.stderr


def test_bisect_names_the_cluster_that_miscomputes(saved_model, tmp_path):
    path, _ = saved_model
    run = blade_cli("bisect", path, "--input", "float32[4,8]", "--quiet", "--no-kernel-calls")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 of 2 clusters differ" in run.stdout

    plugin = tmp_path / "wrong_sigmoid.py"
    plugin.write_text(WRONG_SIGMOID_PLUGIN)
    # Without the engine check, which would refuse the wrong code at compile time.
    run = blade_cli("bisect", path, "--input", "float32[4,8]", "--plugin", plugin, "--quiet",
                    "--no-check-engines", "--no-kernel-calls")
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    wrong = [line for line in lines if "DIFFERS" in line]
    assert len(wrong) == 1 and "aten::sigmoid" in wrong[0], run.stdout
    name = wrong[0].split(":")[0]
    assert f"1 of 2 clusters differ from their TorchScript subgraph beyond rtol=0.0001, " \
           f"atol=0.0001: {name}" in run.stdout
    assert any(line.endswith("[aten::linear, aten::mul.Scalar x2, aten::tanh]")
               and ": ok (" in line for line in lines), run.stdout


def test_key_prints_the_public_key_engines_are_signed_with(capsys, tmp_path):
    assert main(["key"]) == 0
    key = capsys.readouterr().out.strip()
    assert key == blade.signing_public_key() and len(key) == 64
    # Another key file: its own public key, and `optimize` signs with it.
    other = tmp_path / "team.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(other)],
                   check=True)
    assert main(["key", "--signing-key", str(other)]) == 0
    team_key = capsys.readouterr().out.strip()
    assert team_key != key and len(team_key) == 64
    model = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(torch.nn.Tanh()), str(model))
    out = tmp_path / "out.pt"
    assert main(["optimize", str(model), "-o", str(out), "--input", "float32[4,8]",
                 "--quiet", "--signing-key", str(other)]) == 0
    assert torch.jit.load(str(out)).blade_engine_0.signature().startswith(f"ed25519:{team_key}:")


def test_inputs_the_model_does_not_take_are_one_line_errors(saved_model, capsys):
    path, _ = saved_model
    for inputs in (["float32[4,8]", "float32[4,8]"], ["float32[4,9]"]):
        argv = ["optimize", str(path), "-o", "unused.pt", "--quiet"]
        for spec in inputs:
            argv += ["--input", spec]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith(f"blade optimize: error: {path} does not run on the inputs given")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"blade {blade.__version__}"


def _subcommand(name):
    from blade.tools.cli import parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


@pytest.mark.parametrize("command", ["optimize", "bisect"])
def test_every_config_field_is_a_flag_with_its_docstring_as_help(command):
    from blade.tools.cli import NOT_FLAGS, config_help

    actions = {a.dest: a for a in _subcommand(command)._actions}
    helps = config_help()
    for field in dataclasses.fields(blade.Config):
        if field.name in NOT_FLAGS:
            continue
        action = actions[field.name]
        assert f"--{field.name.replace('_', '-')}" in action.option_strings
        assert action.help.startswith(helps[field.name].replace("%", "%%")[:40]), field.name
        assert action.default == field.default or action.default == [], field.name
    assert set(NOT_FLAGS) < {f.name for f in dataclasses.fields(blade.Config)}
    for action in _subcommand(command)._actions:
        assert action.help, action.option_strings
    # Every option with a fixed set of values lists them in the help.
    from blade.config import CHOICES
    help_text = _subcommand(command).format_help()
    for name, values in CHOICES.items():
        assert tuple(actions[name].choices) == values
        assert f"--{name} {{{','.join(values)}}}" in help_text


def test_flags_set_their_config_fields():
    from blade.tools.cli import config_from

    args = _subcommand("optimize").parse_args([
        "m.pt", "-o", "o.pt", "--no-parallel", "--dynamic-dims", "0:0,1",
        "--dynamic-dims", "mask:1", "--exclude", "aten::gelu", "--excluded-ops", "aten::tanh",
        "--min-cluster-size", "3", "--fallback", "error", "--cache-dir", "off",
        "--cache-max-bytes", "1000", "--dry-run", "--preserved-attributes", "helper"])
    config = config_from(args)
    assert config == blade.Config(
        parallel=False, dynamic_dims={0: [0, 1], "mask": [1]},
        excluded_ops=["aten::gelu", "aten::tanh"], min_cluster_size=3, fallback="error",
        cache_dir="off", cache_max_bytes=1000, dry_run=True, preserved_attributes=["helper"],
        progress=True)
    assert config_from(_subcommand("optimize").parse_args(["m.pt", "-o", "o.pt", "--quiet"])) == \
        blade.Config(progress=False)


def test_dynamic_dims_on_the_command_line(saved_model, tmp_path):
    path, model = saved_model
    out = tmp_path / "dynamic.pt"
    assert main(["optimize", str(path), "-o", str(out), "--input", "float32[4,8]", "--quiet",
                 "--dynamic-dims", "0:0"]) == 0
    loaded = torch.jit.load(str(out))
    for batch in (1, 9):
        x = torch.randn(batch, 8)
        with torch.no_grad():
            assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(loaded)
    assert report.guard_fallbacks == 0 and report.runtime_fallbacks == 0, str(report)
    assert all(c.compiled and c.calls == 2 for c in report.clusters), str(report)


@pytest.mark.skipif(not blade.int8_supported(), reason="this CPU has no int8 kernels")
def test_int8_on_the_command_line(saved_model, tmp_path, monkeypatch):
    from blade.frontend import quantize

    monkeypatch.setattr(quantize, "MIN_MACS", 0)  # its one layer is small
    path, model = saved_model
    calibration = tmp_path / "calibration.pt"
    torch.save([torch.randn(4, 8) for _ in range(4)], str(calibration))
    out = tmp_path / "int8.pt"
    assert main(["optimize", str(path), "-o", str(out), "--input", "float32[4,8]", "--quiet",
                 "--precision", "int8", "--calibration", str(calibration),
                 "--float-layers", "no_such_layer"]) == 0
    loaded = torch.jit.load(str(out))
    x = torch.randn(4, 8)
    with torch.no_grad():
        got, want = loaded(x), model(x)
    assert float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(),
                                                       dim=0)) > 0.99
    report = blade.report(loaded)
    assert report.int8 is not None and report.int8["calibration_inputs"] == 4, str(report)
    assert report.int8["layers"], str(report)


@pytest.mark.parametrize("argv, message", [
    (["--input", "int64[2,8]"], "integer inputs need a bound, int64[2,8]:HIGH"),
    (["--input", "float32[4,8]", "--precision", "int8", "--calibration", "no-such.pt"],
     "no-such.pt: no such file"),
    (["--input", "float32[4,8]", "--exclude", "aten::Linear"],
     "'aten::Linear' is not a registered op name or overload; did you mean"),
    (["--input", "float32[4,8]", "--dynamic-dims", "0-1"], "expected INPUT:DIM[,DIM...]"),
    (["--input", "float32[4,8]", "--fallback", "maybe"], "invalid choice: 'maybe'"),
    (["--input", "float32[4,8]", "--min-cluster-size", "0"], "min_cluster_size must be >= 1"),
    (["--inputs", "no-such-inputs.pt"], "--inputs no-such-inputs.pt: no such file"),
    (["--input", "float32[4,8]", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_more_user_errors_are_one_line_with_status_2(saved_model, tmp_path, argv, message):
    path, _ = saved_model
    run = blade_cli("optimize", path, "-o", tmp_path / "o.pt", "--quiet", *argv)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and message in run.stderr, run.stderr


def test_an_unwritable_output_is_one_line(saved_model, tmp_path, capsys):
    path, _ = saved_model
    out = tmp_path / "no-such-dir" / "o.pt"
    assert main(["optimize", str(path), "-o", str(out), "--input", "float32[4,8]",
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot write {out}" in err, err


def test_the_runtimes_spec_dtypes_are_the_dtype_table():
    """Tensor specs are parsed in C++ (csrc/ral/tensor_spec.cpp) and written in Python: the
    runtime's table is blade.dtypes.DTYPES (the same names for the same
    ScalarTypes, in its order), and the command line takes each of them."""
    from blade import dtypes

    assert blade._C.spec_dtypes() == [(d.name, d.scalar_type) for d in dtypes.DTYPES]
    for d in dtypes.DTYPES:
        bound = "" if d.torch.is_floating_point or d.torch == torch.bool else ":3"
        spec = f"{d.name}[2,3]{bound}"
        assert random_input(spec, torch.Generator()).dtype == d.torch, spec
