"""Core ML 1x1 pair fusion (export/coreml/pointwise_fusion.py): exact, and only where it pays.

Core ML programs do not run on Linux; the pass is checked on MIL programs whose constant
weights are read back and evaluated with numpy (a 1x1 convolution is a matrix product
per pixel), and end to end by the pairs and MACs it reports for MobileViTV2.
"""

import json

import numpy as np
import pytest
from model_utils import mobilevitv2_fused_macs

import keras_mvit2 as mv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mil(ct):
    """coremltools' MIL builder, and the fusion pass run with its log, imported when a test
    runs (see the `ct` fixture in conftest.py)."""
    from coremltools.converters.mil import Builder
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    from keras_mvit2.export.coreml.pointwise_fusion import PASS_NAME, collect_fusions

    def run_pass(program):
        with collect_fusions() as fusions:
            PASS_REGISTRY[PASS_NAME](program)
        return fusions

    return Builder, run_pass


def _pointwise(x, weight, bias):
    """numpy 1x1 convolution, NCHW, weight (out, in, 1, 1)."""
    return np.einsum("oc,bchw->bohw", weight[:, :, 0, 0], x) + bias[None, :, None, None]


def _program(mb, rng, channels, *, kernel=1, stride=1, second_reader=False):
    cin, mid, cout = channels
    wa = rng.normal(size=(mid, cin, 1, 1)).astype(np.float32)
    ba = rng.normal(size=mid).astype(np.float32)
    wb = rng.normal(size=(cout, mid, kernel, kernel)).astype(np.float32)
    bb = rng.normal(size=cout).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, cin, 6, 5))])
    def program(x):
        a = mb.conv(x=x, weight=wa, bias=ba, strides=[stride, stride])
        b = mb.conv(x=a, weight=wb, bias=bb)
        out = mb.relu(x=b)
        return (out, mb.relu(x=a)) if second_reader else out

    return program, (wa, ba, wb, bb)


def _convs(program):
    return [op for op in program.functions["main"].operations if op.op_type == "conv"]


def test_fuses_a_pair_into_the_same_function(mil, rng):
    builder, run_pass = mil
    program, (wa, ba, wb, bb) = _program(builder, rng, (8, 12, 6))
    fusions = run_pass(program)
    (fused,) = _convs(program)
    x = rng.normal(size=(2, 8, 6, 5))
    want = _pointwise(_pointwise(x, wa, ba), wb, bb)
    got = _pointwise(x, fused.weight.val, fused.bias.val)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fused.x.name == program.functions["main"].inputs["x"].name
    (fusion,) = fusions
    assert fusion.channels == (8, 12, 6)
    assert fusion.macs_saved == 6 * 5 * (12 * (8 + 6) - 8 * 6)


@pytest.mark.parametrize("case", [
    dict(channels=(16, 4, 16)),                       # a bottleneck: fusing costs MACs
    dict(channels=(8, 12, 6), second_reader=True),    # the middle tensor is read twice
    dict(channels=(8, 12, 6), kernel=3),              # the second is 3x3
    dict(channels=(8, 12, 6), stride=2),              # the first is strided
])
def test_leaves_pairs_it_cannot_fuse(mil, case, rng):
    builder, run_pass = mil
    program, _ = _program(builder, rng, **case)
    fusions = run_pass(program)
    assert len(_convs(program)) == 2 and fusions == []


def test_to_coreml_fuses_mobilevitv2s_three_pairs(mil, tmp_path):
    from keras_mvit2.export.coreml import to_coreml

    model = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=10)
    fused = to_coreml(model, tmp_path / "fused.mlpackage")
    plain = to_coreml(model, tmp_path / "plain.mlpackage", fuse_pointwise=False)
    assert plain.op_histogram["conv"] - fused.op_histogram["conv"] == 3
    pairs = json.loads(fused.metadata["keras_mvit2.pointwise_fusions"])
    # The same pairs as the TFLite export: stage0's projection + stage1's expansion,
    # stage2's and stage3's conv_proj + the next stage's expansion.
    assert [p["channels"] for p in pairs] == [[32, 32, 64], [64, 128, 256], [96, 192, 384]]
    assert sum(p["macs_saved"] for p in pairs) == mobilevitv2_fused_macs(model)
    assert json.loads(plain.metadata["keras_mvit2.pointwise_fusions"]) == []
    assert ".cpuAndNeuralEngine" in fused.metadata["keras_mvit2.compute_units"]
