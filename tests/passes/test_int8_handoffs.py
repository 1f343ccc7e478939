"""frontend/int8_handoffs.py: residual adds folded into int8 convolutions (in the
"quantize_int8" pass) and uint8 handed from int8 layer to int8 layer ("hand_on_uint8")."""
import pytest
import torch

import blade
from blade import _C
from blade.frontend import quantize
from graph_runner import run_pass
from helpers import assert_ran_compiled

pytestmark = pytest.mark.skipif(not blade.int8_supported(),
                                reason="this CPU has no int8 kernels")


@pytest.fixture(autouse=True)
def small_layers_quantized(monkeypatch):
    monkeypatch.setattr(quantize, "MIN_MACS", 0)


class Bottleneck(torch.nn.Module):
    """ResNet's bottleneck: 1x1, 3x3, 1x1 with batch norms, and a projection shortcut
    where the shape changes (else the identity)."""

    def __init__(self, cin, width, stride):
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, 4 * width, 1, bias=False), \
            nn.BatchNorm2d(4 * width)
        self.shortcut = nn.Identity() if stride == 1 and cin == 4 * width else \
            nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False),
                          nn.BatchNorm2d(4 * width))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class Blocks(torch.nn.Module):
    """A stem (float in) max-pooled, a projection block, an identity block, and pooling
    (float out)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.blocks = torch.nn.Sequential(Bottleneck(32, 16, 2), Bottleneck(64, 16, 1))

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, 1)
        return self.blocks(y).mean((2, 3))


def blocks():
    torch.manual_seed(0)
    model = Blocks().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model


def calibration(n=4):
    torch.manual_seed(1)
    return [(torch.randn(2, 3, 24, 20),) for _ in range(n)]


def test_quantize_int8_folds_residual_adds_into_the_convolution_before():
    _, _, after, c = run_pass(blocks(), (torch.randn(2, 3, 24, 20),), "quantize_int8",
                              blade.Config(precision="int8"), calibration())
    # Both blocks' last convolutions take their add and the ReLU after it.
    assert after.count("blade::quantized_conv2d_add(") == 2, after
    assert "aten::add(" not in after
    assert c.int8.residual_adds == 2


def test_hand_on_uint8_keeps_blocks_in_uint8():
    before, _, after, c = run_pass(blocks(), (torch.randn(2, 3, 24, 20),), "hand_on_uint8",
                                   blade.Config(precision="int8"), calibration())
    assert "Char(2, " not in before
    # Every convolution but the last block's last hands on uint8 NHWC: the stem's result
    # is max-pooled as uint8 and read by the first block's 1x1 and its projection (one
    # range), the projection's is the first block's sum; the last one's result is pooled
    # in float32.
    assert c.int8.chained == 7, after
    assert "blade::quantized_max_pool2d(" in after and "aten::max_pool2d" not in after
    assert after.count("Char(2, 6, 5, 64") == 2, after  # the projection and block 1's
    assert after.count("aten::relu(") == 0, after


class ReadAlsoByFloat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.second = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = torch.relu(self.first(x))
        return self.second(y), y.sum()


def test_hand_on_uint8_leaves_a_result_that_a_float_op_reads():
    torch.manual_seed(2)
    cal = [(torch.randn(1, 8, 10, 10),) for _ in range(3)]
    _, _, after, c = run_pass(ReadAlsoByFloat().eval(), (torch.randn(1, 8, 10, 10),),
                              "hand_on_uint8", blade.Config(precision="int8"), cal)
    assert c.int8.chained == 0 and "Char(1, " not in after


def test_residual_blocks_run_compiled_in_uint8_close_to_eager():
    model, cal = blocks(), [x for (x,) in calibration(8)]
    x = torch.randn(2, 3, 24, 20)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        for inputs in (x, torch.randn(2, 3, 24, 20) * 1.5):
            got, want = optimized(inputs), model(inputs)
            cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(),
                                                           dim=0)
            assert float(cosine) > 0.998, float(cosine)
            assert float((got - want).abs().max()) > 1e-5  # int8 ran
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0, str(report)
    assert report.int8["residual_adds"] == 2 and report.int8["chained"] == 7, str(report)
    assert "2 residual adds folded into the convolution before them" in str(report)
    with torch.no_grad():
        engine = getattr(optimized, report.clusters[0].name)
        torch.testing.assert_close(engine.run_code([x]), engine.run_subgraph([x]),
                                   rtol=1e-4, atol=1e-4)


class NormedLinears(torch.nn.Module):
    """A transformer block's shape: a layer norm read by two linears (query and key), a
    linear reading the block's input itself, a second norm before an MLP."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.ln1, self.ln2 = nn.LayerNorm(32), nn.LayerNorm(32)
        self.q, self.k, self.direct = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        y = self.ln1(x)
        h = x + self.q(y) * torch.sigmoid(self.k(y)) + self.direct(x)
        return h + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(h))))


def normed_linears_calibration():
    torch.manual_seed(4)
    return [(torch.randn(2, 16, 32),) for _ in range(4)]


def test_hand_on_uint8_rounds_layer_norm_results_in_the_graph():
    torch.manual_seed(3)
    _, _, after, c = run_pass(NormedLinears().eval(), (torch.randn(2, 16, 32),),
                              "hand_on_uint8", blade.Config(precision="int8"),
                              normed_linears_calibration())
    # ln1's result, read by q and k with one range, is rounded once; ln2's once; the
    # block's input (read by `direct`) is left to the kernel, and fc1's GELU result is
    # handed on by fc1 itself.
    assert c.int8.rounded_in_code == 2 and c.int8.chained == 1, after
    assert after.count("aten::round(") == 2, after
    linears = [line for line in after.splitlines() if "blade::quantized_linear(" in line]
    assert len(linears) == 5
    reads_bytes = [line.split("quantized_linear(")[1].split(",")[0] for line in linears]
    byte_values = {line.split(" : ")[0].strip() for line in after.splitlines()
                   if " : Char(" in line}
    assert sum(v in byte_values for v in reads_bytes) == 4, after  # all but `direct`


def test_layer_norm_results_rounded_by_the_engine_code_match_the_kernel_rounding():
    torch.manual_seed(3)
    model, cal = NormedLinears().eval(), [x for (x,) in normed_linears_calibration()]
    x = torch.randn(2, 16, 32)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        got, want = optimized(x), model(x)
        cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert float(cosine) > 0.999, float(cosine)
        assert float((got - want).abs().max()) > 1e-5  # int8 ran
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0 and report.int8["rounded_in_code"] == 2, str(report)
    assert "2 float activations rounded to uint8 by the engines' code" in str(report)
    with torch.no_grad():
        # The compiled rounding against eager's aten ops on the same graph: same bytes,
        # so the same answer but for float32 summation order.
        engine = getattr(optimized, report.clusters[0].name)
        torch.testing.assert_close(engine.run_code([x]), engine.run_subgraph([x]),
                                   rtol=1e-4, atol=1e-4)


class SqueezeExcited(torch.nn.Module):
    """MobileNetV3's block: an expanding 1x1, a depthwise 3x3 with a hardswish whose float32
    result a squeeze-excitation reads (global pool, two 1x1s, hardsigmoid), the scaled
    result projected by a 1x1."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.expand = nn.Conv2d(8, 32, 1)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.squeeze, self.excite = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
        self.project = nn.Conv2d(32, 8, 1)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.depthwise(torch.relu(self.expand(x))))
        gate = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        gate = torch.nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(gate))))
        return self.project(y * gate)


def squeeze_excited_calibration():
    torch.manual_seed(6)
    return [(torch.randn(1, 8, 14, 14),) for _ in range(4)]


@pytest.mark.skipif(not _C.int8_depthwise_available(),
                    reason="depthwise layers are int8 on Blade's kernel only (AVX-512)")
def test_squeeze_excitation_reads_activated_results_and_projects_rounded_bytes():
    """The depthwise layer's hardswish moves into the layer (its float32 result only the
    activation read); the scaled result, channels-last, is rounded by graph ops and taken
    by the projection as NHWC bytes, as is the pooled vector by the squeeze."""
    torch.manual_seed(5)
    before, _, after, c = run_pass(SqueezeExcited().eval(), (torch.randn(1, 8, 14, 14),),
                                   "hand_on_uint8", blade.Config(precision="int8"),
                                   squeeze_excited_calibration())
    assert "aten::hardswish(" in before and "aten::hardswish(" not in after, after
    assert '"hardswish"' in after
    assert c.int8.rounded_in_code == 2, after
    assert after.count("aten::permute(") == 2, after
    project = next(line for line in after.splitlines()
                   if "blade::quantized_conv2d(" in line and "project" in line)
    operand = project.split("quantized_conv2d(")[1].split(",")[0]
    assert any(line.strip().startswith(operand + " : Char(1, 14, 14, 32")
               for line in after.splitlines()), after


def test_squeeze_excitation_compiled_in_bytes_matches_eager_and_its_graph():
    model = SqueezeExcited().eval()
    cal = [x for (x,) in squeeze_excited_calibration()]
    x = torch.randn(1, 8, 14, 14)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        got, want = optimized(x), model(x)
        cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert float(cosine) > 0.999, float(cosine)
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0 and report.int8["rounded_in_code"] == 2, str(report)
    assert report.int8["engines"], str(report)  # the float twin measured the engine
    with torch.no_grad():
        engine = getattr(optimized, report.clusters[0].name)
        torch.testing.assert_close(engine.run_code([x]), engine.run_subgraph([x]),
                                   rtol=1e-4, atol=1e-4)
