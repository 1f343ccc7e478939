"""blade.tools.opt (`blade-opt`): which passes a command line runs, with which options and
hand-offs, and its errors, each one line on stderr."""
import pytest

from blade.codegen import pipeline
from blade.tools import opt

ADD = """
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def blade_opt(capsys, *argv):
    """blade-opt's exit status, stdout and stderr for `argv`."""
    status = opt.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_list_prints_the_passes_of_the_options_given(capsys):
    status, out, _ = blade_opt(capsys, "--list")
    every = pipeline.build(opt.options())
    assert status == 0 and len(out.splitlines()) == len(every)
    assert "00_torch-function-to-torch-backend-pipeline  (upstream)" in out
    assert any(line.endswith("_sink-slices") for line in out.splitlines())
    _, serial, _ = blade_opt(capsys, "--list", "--option", "parallel_loops=false")
    assert "outline-parallel-loops" in out and "outline-parallel-loops" not in serial


def test_a_slice_runs_from_its_first_pass_to_its_last():
    passes = pipeline.build(opt.options())
    names = [p.name for p in opt.select(passes, "sink-slices", "outline-library-calls")]
    assert names == ["sink-slices", "fold-splat-constants", "outline-library-calls"]
    assert [p.name for p in opt.select(passes, "sink-slices", "sink-slices")] == ["sink-slices"]
    # A bare name is the first run from the slice's start, a label that run.
    labels = opt.labels(passes)
    start = labels.index(next(label for label in labels if label.endswith("_channels-last")))
    later = opt.select(passes, labels[start], "canonicalize")
    assert later[-1].name == "canonicalize" and later[0].name == "channels-last"
    assert opt.select(passes, labels[3], labels[3])[0] is passes[3]
    assert len(opt.select(passes)) == len(passes)


def test_options_and_hand_offs_are_read_as_their_types():
    args = opt.parser().parse_args([
        "--option", "num_buffers=2", "--option", "avx512=true",
        "--handed-on", "noalias={'task': [(5, False), (5, True)]}", "-"])
    assert opt.settings_of(args) == opt.options(num_buffers=2, avx512=True)
    assert opt.handed_on_of(args) == {"noalias": {"task": [(5, False), (5, True)]}}


def test_what_passes_hand_on_is_printed_as_handed_on_reads_it():
    compilation = opt.run(ADD, opt.options(), "sink-slices", "sink-slices",
                          handed_on={"noalias": {"main": [(5, True)]}})
    printed = opt.printed(compilation, handed_on=True)
    assert printed.splitlines()[-2:] == ["// handed on: parallel_tasks=[]",
                                         "// handed on: noalias={'main': [(5, True)]}"]


@pytest.mark.parametrize("argv, status, message", [
    (["--pass", "no-such-pass", "IN"], 2, "the pipeline has no pass 'no-such-pass'"),
    (["--pass", "inline-user-converters", "IN"], 2, "no pass 'inline-user-converters'"),
    (["--from", "lower-gathers", "--to", "sink-slices", "IN"], 2,
     "no pass 'sink-slices' from "),
    (["--pass", "sink-slices", "--from", "sink-slices", "IN"], 2, "either --pass or --from"),
    (["--pass", "sink-slices", "--option", "avx512=maybe", "IN"], 2, "expected true or false"),
    (["--pass", "sink-slices", "--option", "speed=11", "IN"], 2, "--option speed: no such"),
    (["--pass", "sink-slices", "--handed-on", "noalias=[", "IN"], 2, "not a Python literal"),
    (["--pass", "sink-slices", "--handed-on", "statistics={}", "IN"], 2, "not something"),
    (["--pass", "sink-slices", "--user-calls", "no/such.py", "IN"], 2, "no such file"),
    (["--pass", "sink-slices", "no/such.mlir"], 2, "cannot read no/such.mlir"),
    (["--pass", "sink-slices", "BAD"], 2, "BAD:3:8: custom op 'stablehlo.bogus' is unknown"),
    (["--pass", "define-entry-point", "IN"], 1, "pass define-entry-point failed"),
])
def test_errors_are_one_line(capsys, tmp_path, argv, status, message):
    (tmp_path / "in.mlir").write_text(ADD)
    (tmp_path / "bad.mlir").write_text(ADD.replace("stablehlo.add", "stablehlo.bogus"))
    paths = {"IN": str(tmp_path / "in.mlir"), "BAD": str(tmp_path / "bad.mlir")}
    got, out, err = blade_opt(capsys, *[paths.get(word, word) for word in argv])
    err = err.replace(paths["BAD"], "BAD")
    assert (got, out) == (status, "") and len(err.splitlines()) == 1, err
    assert err.startswith("blade-opt: error: ") and message in err, err
