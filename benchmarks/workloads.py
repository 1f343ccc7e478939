"""The benchmark workloads (float32, eval mode, fixed seed), as named in the issues."""
import math

import torch


class EwChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1024))
        self.b = torch.nn.Parameter(torch.randn(1024))

    def forward(self, x):
        return torch.nn.functional.gelu(x * self.w + self.b) * torch.sigmoid(x) + x


class LnGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(768)

    def forward(self, x):
        return torch.nn.functional.gelu(self.ln(x)) + x


class SoftmaxAttn(torch.nn.Module):
    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1])) + mask
        return torch.softmax(scores, dim=-1) @ v


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(1024, 4096)
        self.fc2 = torch.nn.Linear(4096, 1024)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64),
                                torch.nn.ReLU()) for _ in range(4))

    def forward(self, x):
        residual = x
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i % 2 == 1:
                x = x + residual
                residual = x
        return x


class BasicBlock(torch.nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, a projection shortcut
    (strided 1x1 convolution) where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet_stem() -> torch.nn.Module:
    """ResNet's stem: a 7x7 stride-2 convolution, BatchNorm, ReLU, 3x3 stride-2 max pooling."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1))


def trained_statistics(model: torch.nn.Module) -> None:
    """BatchNorm statistics like a trained network's, not 0 and 1."""
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)


class ResNet18(torch.nn.Module):
    """torchvision's resnet18 architecture (written out: torchvision is not installed)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = resnet_stem()
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layers = nn.Sequential(*[block for cin, cout, stride in widths
                                      for block in (BasicBlock(cin, cout, stride),
                                                    BasicBlock(cout, cout, 1))])
        self.fc = nn.Linear(512, 1000)
        trained_statistics(self)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Bottleneck(torch.nn.Module):
    """ResNet-50's bottleneck: 1x1 down, 3x3 (strided where the stage starts), 1x1 up, each
    with BatchNorm, and a projection shortcut where the shape changes."""

    def __init__(self, cin, width, stride):
        super().__init__()
        nn = torch.nn
        cout = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNet50(torch.nn.Module):
    """torchvision's resnet50 architecture (written out: torchvision is not installed)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = resnet_stem()
        blocks, cin = [], 64
        for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(count):
                blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(2048, 1000)
        trained_statistics(self)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _divisible_by_8(channels: float) -> int:
    return max(8, int(channels + 4) // 8 * 8)


class SqueezeExcitation(torch.nn.Module):
    """Channel attention: global average pool, 1x1 down, ReLU, 1x1 up, hardsigmoid, scale."""

    def __init__(self, channels):
        super().__init__()
        squeezed = _divisible_by_8(channels / 4)
        self.down = torch.nn.Conv2d(channels, squeezed, 1)
        self.up = torch.nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        scale = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        scale = torch.nn.functional.hardsigmoid(self.up(torch.relu(self.down(scale))))
        return x * scale


class InvertedResidual(torch.nn.Module):
    """MobileNetV3's block: 1x1 expansion, depthwise k x k (strided where the stage starts),
    squeeze-excitation where the table says, 1x1 projection, each convolution with
    BatchNorm, ReLU or hardswish; a residual where the shape stays."""

    def __init__(self, cin, kernel, expanded, cout, se, activation, stride):
        super().__init__()
        nn = torch.nn
        act = nn.Hardswish if activation == "HS" else nn.ReLU
        layers = []
        if expanded != cin:
            layers += [nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded), act()]
        layers += [nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded,
                             bias=False), nn.BatchNorm2d(expanded), act()]
        if se:
            layers.append(SqueezeExcitation(expanded))
        layers += [nn.Conv2d(expanded, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3(torch.nn.Module):
    """torchvision's mobilenet_v3_large architecture (written out: torchvision is not
    installed): kernel, expanded width, output width, squeeze-excitation, activation,
    stride per block, as in the paper's table 1."""

    BLOCKS = ((3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2),
              (3, 72, 24, False, "RE", 1), (5, 72, 40, True, "RE", 2),
              (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
              (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1),
              (3, 184, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
              (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
              (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1),
              (5, 960, 160, True, "HS", 1))

    def __init__(self):
        super().__init__()
        nn = torch.nn
        layers, cin = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                       nn.Hardswish()], 16
        for kernel, expanded, cout, se, activation, stride in self.BLOCKS:
            layers.append(InvertedResidual(cin, kernel, expanded, cout, se, activation, stride))
            cin = cout
        layers += [nn.Conv2d(cin, 960, 1, bias=False), nn.BatchNorm2d(960), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(),
                                        nn.Linear(1280, 1000))
        trained_statistics(self)

    def forward(self, x):
        x = torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class MBConv(torch.nn.Module):
    """EfficientNet's block: 1x1 expansion (where the ratio is not 1), depthwise k x k
    (strided where the stage starts), squeeze-excitation (SiLU, sigmoid; squeezed to a
    quarter of the block's input width), 1x1 projection, each convolution with BatchNorm
    and SiLU but the last; a residual where the shape stays."""

    def __init__(self, cin, cout, kernel, stride, ratio):
        super().__init__()
        nn = torch.nn
        expanded = cin * ratio
        layers = []
        if ratio != 1:
            layers += [nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded),
                       nn.SiLU()]
        layers += [nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded,
                             bias=False), nn.BatchNorm2d(expanded), nn.SiLU()]
        self.expand = nn.Sequential(*layers)
        squeezed = max(1, cin // 4)
        self.se_down, self.se_up = nn.Conv2d(expanded, squeezed, 1), \
            nn.Conv2d(squeezed, expanded, 1)
        self.project = nn.Sequential(nn.Conv2d(expanded, cout, 1, bias=False),
                                     nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.expand(x)
        scale = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        scale = torch.sigmoid(self.se_up(torch.nn.functional.silu(self.se_down(scale))))
        y = self.project(y * scale)
        return x + y if self.residual else y


class EfficientNetB0(torch.nn.Module):
    """torchvision's efficientnet_b0 architecture (written out: torchvision is not
    installed): per stage the expansion ratio, kernel, stride, output width and block
    count of the paper's table 1."""

    STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

    def __init__(self):
        super().__init__()
        nn = torch.nn
        layers, cin = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()], 32
        for ratio, kernel, stride, cout, count in self.STAGES:
            for k in range(count):
                layers.append(MBConv(cin, cout, kernel, stride if k == 0 else 1, ratio))
                cin = cout
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, 1000)
        trained_statistics(self)

    def forward(self, x):
        x = torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class ChannelsLayerNorm(torch.nn.Module):
    """LayerNorm over the channels of an NCHW image, as ConvNeXt's downsampling layers
    apply it."""

    def __init__(self, channels):
        super().__init__()
        self.norm = torch.nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(torch.nn.Module):
    """ConvNeXt's block: depthwise 7x7, LayerNorm over channels (channels last), a 4x
    pointwise MLP with GELU, a learned per-channel scale, the residual."""

    def __init__(self, channels):
        super().__init__()
        nn = torch.nn
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.up, self.down = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.rand(channels) * 0.5 + 0.1)

    def forward(self, x):
        y = self.norm(self.depthwise(x).permute(0, 2, 3, 1))
        y = self.down(torch.nn.functional.gelu(self.up(y))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtTiny(torch.nn.Module):
    """torchvision's convnext_tiny architecture (written out): a 4x4 stride-4 stem, stages
    of (3, 3, 9, 3) blocks at widths (96, 192, 384, 768), LayerNorm and a 2x2 stride-2
    convolution between stages, pooling, LayerNorm and the classifier."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        widths, depths = (96, 192, 384, 768), (3, 3, 9, 3)
        layers = [nn.Conv2d(3, widths[0], 4, 4), ChannelsLayerNorm(widths[0])]
        for stage, (width, depth) in enumerate(zip(widths, depths)):
            if stage:
                layers += [ChannelsLayerNorm(widths[stage - 1]),
                           nn.Conv2d(widths[stage - 1], width, 2, 2)]
            layers += [ConvNeXtBlock(width) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(widths[-1], eps=1e-6)
        self.classifier = nn.Linear(widths[-1], 1000)

    def forward(self, x):
        x = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)
        return self.classifier(self.norm(x))


class UNetDecoder(torch.nn.Module):
    """One U-Net level: a strided convolution down, x2 nearest upsampling back, the skip
    connection concatenated, a convolution."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.down = torch.nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.out = torch.nn.Conv2d(96, 32, 3, padding=1)

    def forward(self, x):
        skip = torch.relu(self.inner(x))
        coarse = torch.relu(self.down(skip))
        up = torch.nn.functional.interpolate(coarse, scale_factor=2.0, mode="nearest")
        return torch.relu(self.out(torch.cat([skip, up], 1)))


class GptBlock(torch.nn.Module):
    """A GPT-2 decoder block: pre-LayerNorm causal self-attention and a tanh-GELU MLP."""

    def __init__(self, width=512, heads=8):
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, length, width = x.size(0), x.size(1), x.size(2)
        heads = [batch, length, self.heads, width // self.heads]
        q, k, v = self.qkv(self.ln1(x)).split(width, 2)
        q, k, v = (q.view(heads).transpose(1, 2), k.view(heads).transpose(1, 2),
                   v.view(heads).transpose(1, 2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, length, width))
        hidden = torch.nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh")
        return x + self.fc2(hidden)


def build(name):
    """(model, example inputs) for a workload name."""
    torch.manual_seed(0)
    if name == "ew_chain":
        return EwChain().eval(), (torch.randn(4096, 1024),)
    if name == "ln_gelu":
        return LnGelu().eval(), (torch.randn(32, 128, 768),)
    if name == "softmax_attn":
        q, k, v = (torch.randn(8, 12, 128, 64) for _ in range(3))
        mask = torch.where(torch.rand(8, 1, 1, 128) > 0.1, 0.0, -1e4)
        return SoftmaxAttn().eval(), (q, k, v, mask)
    if name == "mlp":
        return Mlp().eval(), (torch.randn(64, 1024),)
    if name == "bert_layer":
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, dropout=0.0)
        return layer.eval(), (torch.randn(4, 128, 768),)
    if name == "convnet":
        return ConvNet().eval(), (torch.randn(4, 64, 56, 56),)
    if name == "resnet18":
        return ResNet18().eval(), (torch.randn(2, 3, 224, 224),)
    if name == "unet_decoder":
        return UNetDecoder().eval(), (torch.randn(2, 16, 96, 96),)
    if name == "gpt_block":
        return GptBlock().eval(), (torch.randn(4, 128, 512),)
    if name == "resnet50":
        return ResNet50().eval(), (torch.randn(1, 3, 224, 224),)
    if name == "resnet50_b8":
        return ResNet50().eval(), (torch.randn(8, 3, 224, 224),)
    if name == "mobilenet":
        return MobileNetV3().eval(), (torch.randn(1, 3, 224, 224),)
    if name == "efficientnet":
        return EfficientNetB0().eval(), (torch.randn(1, 3, 224, 224),)
    if name == "convnext":
        return ConvNeXtTiny().eval(), (torch.randn(1, 3, 224, 224),)
    if name == "bert_base":  # 12 encoder layers with distinct weights
        layers = [torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, dropout=0.0)
                  for _ in range(12)]
        return torch.nn.Sequential(*layers).eval(), (torch.randn(1, 128, 768),)
    if name == "gpt2":  # 12 GPT-2-sized decoder blocks
        blocks = [GptBlock(768, 12) for _ in range(12)]
        return torch.nn.Sequential(*blocks).eval(), (torch.randn(1, 128, 768),)
    raise KeyError(name)


# What `make bench` runs: the six standard workloads and the real-model ones the peers are
# compared on; EXTRA_WORKLOADS only when named.
WORKLOADS = ("ew_chain", "ln_gelu", "softmax_attn", "mlp", "bert_layer", "convnet",
             "resnet50", "resnet50_b8", "bert_base", "mobilenet", "efficientnet", "convnext",
             "gpt_block")
EXTRA_WORKLOADS = ("resnet18", "unet_decoder", "gpt2")
