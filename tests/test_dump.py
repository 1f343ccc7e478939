"""Config(dump_dir) / BLADE_DUMP_DIR: every codegen pass of every cluster, the graph after
every pass of the TorchScript-level pipeline."""
import json
import os
import subprocess
import sys

import torch

import blade
from blade.codegen import pipeline
from blade.frontend import pipeline as graph_pipeline
from helpers import TwoClusters

TRACE = blade.Config(allow_tracing=True)
CLUSTER_FILES = ["0_torchscript.txt", "1_torch.mlir", "passes", "2_llvm.ll", "timings.json"]


def check_dump(root, clusters):
    for name in clusters:
        directory = root / name
        assert sorted(p.name for p in directory.iterdir()) == sorted(CLUSTER_FILES)
        assert "graph(" in (directory / "0_torchscript.txt").read_text()
        assert "torch.aten" in (directory / "1_torch.mlir").read_text()
        # The module after every pass of the pipeline, in its order, as the pass manager
        # printed it.
        expected = [f"{i:02d}_{p.name}.mlir" for i, p in
                    enumerate(pipeline.build(pipeline.Options(num_buffers=0)))]
        dumped = sorted(p.name for p in (directory / "passes").iterdir())
        assert dumped == expected
        after = {name.split("_", 1)[1][:-len(".mlir")]: directory / "passes" / name
                 for name in dumped}
        assert "stablehlo." in after["stablehlo-legalize-deprecated-ops"].read_text()
        assert "linalg." in after["linalg-fuse-elementwise-ops"].read_text()
        assert "memref" in after["one-shot-bufferize"].read_text()
        assert "llvm.func" in (directory / "passes" / dumped[-1]).read_text()
        assert "define void @blade_entry(ptr" in (directory / "2_llvm.ll").read_text()
        timings = json.loads((directory / "timings.json").read_text())
        assert {"import", "native", "total", *(name[:-len(".mlir")] for name in dumped)} \
            <= set(timings)
    # The graph after every pass of the TorchScript-level pipeline, in its order.
    graphs = sorted(p.name for p in (root / "graph").iterdir())
    assert graphs == [f"{i:02d}_{p.name}.txt" for i, p in
                      enumerate(graph_pipeline.build(blade.Config()))]
    after = {name.split("_", 1)[1][:-len(".txt")]: root / "graph" / name for name in graphs}
    assert "prim::FunctionalGraph" in after["cluster"].read_text()
    assert "blade::execute" in (root / "graph" / graphs[-1]).read_text()
    assert "Blade report" in (root / "report.txt").read_text()


def test_dump_dir_has_every_stage_of_every_cluster(tmp_path):
    model = TwoClusters().eval()
    optimized = blade.optimize(model, (torch.randn(4, 8),),
                               blade.Config(dump_dir=str(tmp_path / "dump"), kernel_calls=False))
    clusters = [c.name for c in blade.report(optimized).clusters]
    assert len(clusters) == 2
    check_dump(tmp_path / "dump", clusters)


def test_dump_dir_from_the_environment(tmp_path):
    script = (
        "import torch, blade, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from helpers import TwoClusters\n"
        "blade.optimize(TwoClusters().eval(), (torch.randn(4, 8),),\n"
        "               blade.Config(kernel_calls=False))\n"
    )
    env = dict(os.environ, BLADE_DUMP_DIR=str(tmp_path / "env_dump"))
    run = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    check_dump(tmp_path / "env_dump", ["blade_engine_0", "blade_engine_1"])


def test_a_failing_cluster_leaves_its_ir_and_the_error(tmp_path):
    def broken(ctx):
        raise ValueError("broken on purpose")

    converter = blade.register_converter("aten::erfinv")(broken)
    try:
        model = TwoClusters().eval()
        blade.optimize(model, (torch.randn(4, 8),),
                       blade.Config(dump_dir=str(tmp_path), kernel_calls=False))
    finally:
        blade.unregister_converter(converter)
    failed = [d for d in tmp_path.iterdir() if (d / "error.txt").exists()]
    assert len(failed) == 1, list(tmp_path.iterdir())
    assert "broken on purpose" in (failed[0] / "error.txt").read_text()
    assert "aten::erfinv" in (failed[0] / "0_torchscript.txt").read_text()
    assert (failed[0] / "1_torch.mlir").exists()   # the import that led to the failure
    assert "total" in json.loads((failed[0] / "timings.json").read_text())
