"""nn.LSTMCell and nn.GRUCell (aten::lstm_cell, aten::gru_cell: no lowering in Torch-MLIR)
compile through Blade's decompositions, with and without biases, batched and not, and
give eager's results over an unrolled sequence."""
import pytest
import torch

import blade
from helpers import run_compiled


class Unrolled(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.lstm = torch.nn.LSTMCell(16, 24, bias=bias)
        self.gru = torch.nn.GRUCell(24, 24, bias=bias)

    def forward(self, xs, h, c):
        for t in range(xs.shape[0]):
            h, c = self.lstm(xs[t], (h, c))
            h = self.gru(h, c)
        return h, c


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [(3,), ()], ids=["batched", "unbatched"])
def test_lstm_and_gru_cells_compile_and_match_eager(bias, batch):
    torch.manual_seed(0)
    model = Unrolled(bias).eval()
    inputs = (torch.randn(4, *batch, 16), torch.randn(*batch, 24), torch.randn(*batch, 24))
    _, report = run_compiled(model, inputs, blade.Config(cache_dir="off"), atol=1e-5)
    assert report.decomposed.get("aten::lstm_cell") and report.decomposed.get("aten::gru_cell"), \
        str(report)
    assert not any(op in report.unsupported for op in ("aten::lstm_cell", "aten::gru_cell")), \
        str(report)
    # What stays TorchScript is views of inputs with nothing computed around them (the
    # unsqueeze of an unbatched step), which alias their inputs.
    assert all("no compute op" in reason for entry in report.unsupported.values()
               for reason in entry.reasons), str(report)
