"""Every attention mechanism, inside MobileViTv2-0.5 and DeiT-Tiny, converts to TFLite
(builtin ops only, run in LiteRT); inside a DeiT-Tiny of two blocks to a Core ML ML Program
(inside MobileViTv2-0.5: `tests/test_attention_contract.py`); the linear mechanisms have no
N x N tensor in the converted graph."""

import keras
import numpy as np
import pytest
from model_utils import ATTENTION_CONFIGS, perturb_norms

import keras_mvit2 as mv
from keras_mvit2.export import run_tflite, to_tflite

LINEAR = ("separable", "linformer", "rfa", "mobile_attention")
DEIT_TOKENS = 37  # 96x96 input, 16x16 patches: 36 patches + the class token


def test_every_registered_mechanism_is_covered():
    assert sorted(ATTENTION_CONFIGS) == mv.attention.available()


def _mobilevitv2(attention):
    return mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=10,
                          classifier_activation=None, attention=attention)


def _deit_tiny(attention, **kwargs):
    config = dict(attention) if isinstance(attention, dict) else {"name": attention}
    config.pop("num_heads", None)  # DeiT-Tiny has 3 heads; the model sets them
    return mv.create_model("deit_tiny", input_shape=(96, 96, 3), classes=10,
                           classifier_activation=None, attention=config, **kwargs)


#: Blocks of the DeiT-Tiny converted to Core ML: its 12 blocks are one block repeated (same
#: layers, same ops, other weights), and the Core ML test asserts what the program holds, not
#: numbers; two blocks keep a block's output feeding the next one's attention, at less than
#: half the conversion time. The TFLite test converts and compares the whole 12-block model.
COREML_DEIT_DEPTH = 2


def _max_axes_equal(shape, n):
    return sum(1 for d in shape if d == n)


@pytest.mark.parametrize("host", ["mobilevitv2_050", "deit_tiny"])
@pytest.mark.parametrize("name", sorted(ATTENTION_CONFIGS))
def test_tflite_builtin_only_and_equal_to_keras(name, host, tmp_path, rng, capsys):
    build = _mobilevitv2 if host == "mobilevitv2_050" else _deit_tiny
    model = build(ATTENTION_CONFIGS[name])
    perturb_norms(model, seed=1)
    shape = model.input_shape[1:]
    x = rng.uniform(size=(2, *shape)).astype("float32")
    want = keras.ops.convert_to_numpy(model(x, training=False))
    report = to_tflite(model, tmp_path / "m.tflite")
    got = run_tflite(report.path, x)
    with capsys.disabled():
        print(f"\n[attention-export] {host} + {name}: {report.num_ops} ops, "
              f"BATCH_MATMUL={report.op_histogram.get('BATCH_MATMUL', 0)}, "
              f"TRANSPOSE={report.op_histogram.get('TRANSPOSE', 0)}, "
              f"xnnpack partitions={report.num_xnnpack_partitions}, "
              f"max|diff|={np.abs(got - want).max():.2e}")
    assert report.flex_ops == [] and report.custom_ops == []
    assert report.max_tensor_rank <= 4
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, atol=1e-4 * scale)
    if host == "deit_tiny":
        # Linear cost, checked on the converted graph: no tensor with two axes of N tokens,
        # but where an N x N matrix takes fewer multiply-adds than the linear form (the kernel
        # attentions' `functional.kernel_numerator`: N (F + d) < 2 F d, here 37 tokens; RFA's
        # F = 128 features and d = 64 channels take it, Mobile-Attention's F = d = 64 too).
        tensors = _tflite_tensor_shapes(report.path)
        quadratic = [s for s in tensors if _max_axes_equal(s, DEIT_TOKENS) >= 2]
        if name in ("rfa", "mobile_attention"):
            kind = (mv.layers.RandomFeatureAttention if name == "rfa"
                    else mv.layers.MobileAttention)
            layer = next(x for x in model._flatten_layers() if isinstance(x, kind))
            d = layer.head_dim
            f = layer.num_features if name == "rfa" else d
            assert bool(quadratic) == (DEIT_TOKENS * (f + d) < 2 * f * d), (f, d, quadratic[:3])
        elif name in LINEAR:
            assert quadratic == [], f"{name} has N x N tensors: {quadratic[:3]}"
        else:
            assert quadratic, "MHA must show its N x N attention matrix (the check can fail)"


def _tflite_tensor_shapes(path):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(str(path))
    return [tuple(t["shape"]) for t in interpreter.get_tensor_details()]


@pytest.mark.slow
@pytest.mark.usefixtures("ct")
@pytest.mark.parametrize("name", sorted(ATTENTION_CONFIGS))
def test_coreml_ml_program_in_deit_tiny(name, tmp_path):
    """Every attention inside DeiT-Tiny (its blocks: `COREML_DEIT_DEPTH` of them) converts
    to an ML Program: the attention's call on `(B, N, D)` tokens. Inside MobileViTv2-0.5
    (`(B, P, N, d)` tokens; the separable attention channels-first) each one is converted,
    and its layout checked, by
    `tests/test_attention_contract.py::test_coreml_converts_in_the_attentions_layout`."""
    from keras_mvit2.export import to_coreml

    model = _deit_tiny(ATTENTION_CONFIGS[name], depth=COREML_DEIT_DEPTH)
    report = to_coreml(model, tmp_path / "m.mlpackage", quantization="float32",
                       image_input=False)
    assert report.max_tensor_rank <= 5
    assert report.outputs[0]["shape"] == [1, 10]
    assert report.metadata["keras_mvit2.attention"] == name  # the package says which one




@pytest.mark.slow
@pytest.mark.usefixtures("ct")
@pytest.mark.parametrize("name", ["mobilevit_xxs", "mobilevit_xs", "mobilevit_s"])
def test_mobilevit_v1_converts_to_tflite_and_coreml(name, tmp_path, rng):
    """The v1 baselines (MHA, fusion block) export like the rest of the zoo: each to TFLite
    (compared with Keras), and to Core ML the smallest: the three are one architecture
    (the same layers and ops, other channel counts), and the Core ML check is structural."""
    from keras_mvit2.export import to_coreml

    model = mv.create_model(name, input_shape=(64, 64, 3), classes=10,
                            classifier_activation=None)
    perturb_norms(model, seed=2)
    x = rng.uniform(size=(2, 64, 64, 3)).astype("float32")
    want = keras.ops.convert_to_numpy(model(x, training=False))
    report = to_tflite(model, tmp_path / "m.tflite")
    assert report.flex_ops == [] and report.custom_ops == [] and report.max_tensor_rank <= 4
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(run_tflite(report.path, x), want, atol=1e-4 * scale)
    if name != "mobilevit_xxs":
        return
    coreml = to_coreml(model, tmp_path / "m.mlpackage", quantization="float32", image_input=False)
    assert coreml.max_tensor_rank <= 5 and coreml.outputs[0]["shape"] == [1, 10]
