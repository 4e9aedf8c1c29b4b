"""Export the small PyTorch models whose .onnx files tests/models/test_torch_models.py runs.

Regenerate everything (not run in CI; the tests need only the committed .onnx/.data files):

    pip install torch==2.13.0 onnxscript     # CPU wheel; used for exporting only
    python tests/data/torch/export_models.py            # or name models: ... seqencoder

Exported with torch 2.13.0+cpu, onnxscript 0.7.2, onnx 1.23.2.

Every architecture is exported twice, into <name>_<exporter>.onnx beside this script:
- ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=17)``
- ``dynamo``: ``torch.onnx.export(..., dynamo=True, opset_version=18)``

The models are small on purpose (weights of a few hundred KB at most) and seeded, so a
re-export gives the same weights. ``resnet`` and ``gpt`` keep their weights in an external
data file (<name>_<exporter>.data); the others are self-contained. Some models have a
dynamic batch (or sequence) dim, the others static shapes — see MODELS at the bottom.
"""

from __future__ import annotations

import math
import pathlib
import sys
import tempfile
from dataclasses import dataclass, field

import onnx
import torch
from onnx import TensorProto, external_data_helper, numpy_helper
from torch import nn
from torch.nn import functional as F

HERE = pathlib.Path(__file__).resolve().parent
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


# -- architectures ------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.net(x)


class LeNet5(nn.Module):
    """LeNet-5 on a 1x32x32 image: conv-tanh-avgpool twice, then three linear layers."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 5)
        self.c3 = nn.Conv2d(6, 16, 5)
        self.f5 = nn.Linear(16 * 5 * 5, 120)
        self.f6 = nn.Linear(120, 84)
        self.f7 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.avg_pool2d(torch.tanh(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c3(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.f5(x))
        x = F.relu(self.f6(x))
        return F.log_softmax(self.f7(x), dim=1)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """A ResNet-18-style network cut down to a stem and two basic blocks."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.block1 = BasicBlock(16, 16, 1)
        self.block2 = BasicBlock(16, 32, 2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, 1)
        x = self.block2(self.block1(x))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project (linear), ReLU6."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class MobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()
        )
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 1, 4),
            InvertedResidual(16, 24, 2, 6),
            InvertedResidual(24, 24, 1, 6),
        )
        self.head = nn.Sequential(nn.Conv2d(24, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6())
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(x.mean((2, 3)))


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer (post-norm, Erf-GELU) with a key-padding mask input:
    ``mask[b, s]`` True means token s of sequence b is padding and is not attended to."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, activation="gelu",
            batch_first=True,
        )  # fmt: skip

    def forward(self, x, mask):
        return self.layer(x, src_key_padding_mask=mask)


class SeqEncoder(nn.Module):
    """A two-layer nn.TransformerEncoder (post-norm, ReLU) over [batch, seq, 64], no mask,
    exported with dynamic batch and seq, by dynamo only: the torchscript exporter bakes the
    example's seq (7) into nn.MultiheadAttention's q reshape (pytorch#110347), so its file
    would run at that length alone (onnxruntime's too)."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True
        )
        # No nested tensors: without a padding mask they'd never be built, but say so.
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A nanoGPT-style decoder: token + position embeddings, two pre-norm blocks with
    causal self-attention, a final LayerNorm and a tied language-model head."""

    def __init__(self, vocab=64, block=16, dim=32, heads=4, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.blocks = nn.ModuleList([GPTBlock(dim, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LSTM(nn.Module):
    """A two-layer bidirectional nn.LSTM (sequence-first) and a linear read-out."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 24, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(48, 5)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(out), h, c


# -- export -------------------------------------------------------------------------------


@dataclass
class Spec:
    """One model to export: its inputs (name -> example tensor), output names, which
    input dims are dynamic (input name -> {axis: dim name}) and whether its weights go
    to an external data file."""

    make: type[nn.Module]
    inputs: dict[str, torch.Tensor]
    outputs: list[str]
    dynamic: dict[str, dict[int, str]] = field(default_factory=dict)
    external: bool = False
    exporters: tuple[str, ...] = ("torchscript", "dynamo")


def randomise_batchnorm(model: nn.Module) -> None:
    """Give every BatchNorm non-trivial running statistics and affine parameters, so the
    exported inference-mode BatchNormalization (or its folding) is really exercised."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)


def padding_mask() -> torch.Tensor:
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, 7:] = True
    mask[1, 4:] = True
    return mask


g = torch.Generator().manual_seed(1)
MODELS = {
    "mlp": Spec(MLP, {"x": torch.randn(2, 32, generator=g)}, ["y"], {"x": {0: "batch"}}),
    "lenet": Spec(LeNet5, {"x": torch.randn(1, 1, 32, 32, generator=g)}, ["y"]),
    "resnet": Spec(
        ResNet,
        {"x": torch.randn(2, 3, 32, 32, generator=g)},
        ["y"],
        {"x": {0: "batch"}},
        external=True,
    ),
    "mobilenet": Spec(MobileNet, {"x": torch.randn(2, 3, 32, 32, generator=g)}, ["y"]),
    "encoder": Spec(
        Encoder,
        {"x": torch.randn(2, 10, 32, generator=g), "mask": padding_mask()},
        ["y"],
        {"x": {0: "batch"}, "mask": {0: "batch"}},
    ),
    "gpt": Spec(
        GPT,
        {"idx": torch.randint(0, 64, (2, 8), generator=g)},
        ["logits"],
        {"idx": {0: "batch", 1: "seq"}},
        external=True,
    ),
    "lstm": Spec(
        LSTM, {"x": torch.randn(7, 2, 16, generator=g)}, ["y", "h", "c"], {"x": {1: "batch"}}
    ),
    "seqencoder": Spec(
        SeqEncoder,
        {"x": torch.randn(2, 7, 64, generator=g)},
        ["y"],
        {"x": {0: "batch", 1: "seq"}},
        exporters=("dynamo",),
    ),
}


def export_torchscript(model: nn.Module, spec: Spec, path: pathlib.Path) -> None:
    torch.onnx.export(
        model, tuple(spec.inputs.values()), str(path), dynamo=False, opset_version=17,
        input_names=list(spec.inputs), output_names=spec.outputs,
        dynamic_axes=spec.dynamic or None,
    )  # fmt: skip


def export_dynamo(model: nn.Module, spec: Spec, path: pathlib.Path) -> None:
    dims: dict[str, torch.export.Dim] = {}
    shapes = None
    if spec.dynamic:
        shapes = {
            name: {axis: dims.setdefault(dim, torch.export.Dim(dim)) for axis, dim in axes.items()}
            for name, axes in spec.dynamic.items()
        }
        shapes = {name: shapes.get(name) for name in spec.inputs}
    program = torch.onnx.export(
        model, tuple(spec.inputs.values()), dynamo=True, opset_version=18,
        input_names=list(spec.inputs), output_names=spec.outputs, dynamic_shapes=shapes,
    )  # fmt: skip
    program.save(str(path), external_data=False)


def save(tmp: pathlib.Path, name: str, external: bool) -> None:
    """Re-save an exported model into this directory, weights inline or in <name>.data.

    External data takes every floating-point initializer, scalars included (as
    ``size_threshold=0`` would); integer ones (Reshape shapes, Slice starts, ReduceMean
    axes) stay inline, since onnxruntime's and onnx's shape inference can't read those
    from external data and refuse the model."""
    model = onnx.load(str(tmp))
    for stale in (HERE / f"{name}.onnx", HERE / f"{name}.data"):
        stale.unlink(missing_ok=True)
    if external:
        for tensor in model.graph.initializer:
            if tensor.data_type in FLOAT_TYPES:
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
                external_data_helper.set_external_data(tensor, f"{name}.data")
    onnx.save_model(model, str(HERE / f"{name}.onnx"))
    if external:
        (HERE / f"{name}.data").chmod(0o644)
    onnx.checker.check_model(str(HERE / f"{name}.onnx"), full_check=True)


EXPORTERS = {"torchscript": export_torchscript, "dynamo": export_dynamo}


def main(names: list[str]) -> None:
    """Export the named models (all of MODELS when none are named)."""
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in names or MODELS:
            spec = MODELS[name]
            torch.manual_seed(0)
            model = spec.make()
            with torch.no_grad():
                randomise_batchnorm(model)
            model.eval()
            for exporter in spec.exporters:
                export = EXPORTERS[exporter]
                tmp = pathlib.Path(tmpdir) / f"{name}_{exporter}.onnx"
                # Not under no_grad: nn.TransformerEncoderLayer would take its fused fast
                # path (aten::_transformer_encoder_layer_fwd), which doesn't export.
                export(model, spec, tmp)
                save(tmp, f"{name}_{exporter}", spec.external)
                print(f"exported {name}_{exporter}")


if __name__ == "__main__":
    main(sys.argv[1:])
