"""Test helpers shared by several test modules."""

import importlib.util

import keras
import numpy as np

# Per-mechanism settings of every registered attention that fit both test hosts,
# MobileViTV2-0.5 and DeiT-Tiny (Linformer projects the tokens to p < N).
ATTENTION_CONFIGS = {
    "separable": "separable",
    "mha": {"name": "mha", "num_heads": 4},
    "linformer": {"name": "linformer", "num_heads": 4, "projected_tokens": 8},
    "rfa": {"name": "rfa", "num_heads": 4},
    "mobile_attention": {"name": "mobile_attention", "num_heads": 4},
}


# XLA's CPU compiler at its quickest, for the tests' JAX processes: eager JAX compiles every
# op of a new shape (each variable's initializer, ~60 ms each), and `predict` or a training
# step compiles the whole graph (~8 s for a MobileViTV2-0.5). These halve both (at 32x32:
# build 6.3 -> 2.5 s, first predict 7.9 -> 4.1 s); the outputs stay within float32 rounding
# of TensorFlow's. Not for benchmarks: the compiled code runs slower.
JAX_QUICK_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def jax_quick_compile(env: dict[str, str]) -> dict[str, str]:
    """`env` with `JAX_QUICK_COMPILE` added to its `XLA_FLAGS`."""
    return {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {JAX_QUICK_COMPILE}".strip()}


def perturb_norms(model: keras.Model, seed: int = 0) -> None:
    """Random BN statistics and affine parameters, so norms are really exercised."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        name = w.path.rsplit("/", 1)[-1]
        n = w.shape
        if name == "moving_mean":
            w.assign(rng.normal(0.0, 0.2, n).astype("float32"))
        elif name == "moving_variance":
            w.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
        elif name == "gamma":
            w.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
        elif name == "beta":
            w.assign(rng.normal(0.0, 0.2, n).astype("float32"))


def spread_affines(model: keras.Model, rng) -> keras.Model:
    """Gives `model`'s norm affines and biases values as a trained model's (gamma about 1,
    beta and biases about 0, spread 0.3; not the 1 / 0 initialization), drawn from the
    numpy Generator `rng` (the caller's stream goes on to draw the inputs), in place;
    returns `model`. Unlike `perturb_norms`, it moves the biases too and leaves the
    BatchNorm statistics."""
    for weight in model.weights:
        if weight.path.endswith(("gamma", "beta", "bias")):
            shift = 1.0 if weight.path.endswith("gamma") else 0.0
            weight.assign(shift + 0.3 * rng.standard_normal(weight.shape).astype("float32"))
    return model


#: The two halves of `layer_zoo` (two small models: each compiles in half the time on JAX):
#: the attentions of each part's MobileViTV2Blocks, and whether it has the v1 and ViT paths.
LAYER_ZOO_PARTS = {
    "separable_mha": (("separable", "mha"), False),
    "linformer_mobile": (("linformer", "mobile_attention"), False),
    "rfa_v1_vit": (("rfa",), True),
}


def layer_zoo(part: str, size: int = 16, channels: int = 16) -> keras.Model:
    """Every layer of `keras_mvit2.layers` and of the model families that a model is made
    of, in three small models (`part`, a key of `LAYER_ZOO_PARTS`): each has an
    InvertedResidual and a MobileViTV2Block (GroupNorm1, TransformerLayer, the token mixer;
    StochasticDepth through `drop_path`) per attention of its part; the last also a
    MobileViT v1 block and a ViT path (PatchEmbedding, ClassTokenPositionEmbedding,
    ViTBlock, TokenPooling). Input `(batch, size, size, 3)`; output `(batch, paths *
    channels)`, the pooled features of each path."""
    from keras_mvit2 import layers, models

    attentions, v1_and_vit = LAYER_ZOO_PARTS[part]
    x = keras.Input((size, size, 3))
    h = layers.InvertedResidual(channels, expansion=2.0, name="inverted_residual")(x)
    outputs = []
    for name in attentions:
        block = models.MobileViTV2Block(channels, 1, attention=ATTENTION_CONFIGS[name],
                                        drop_path=0.1, name=f"mobilevitv2_block_{name}")
        outputs.append(keras.layers.GlobalAveragePooling2D()(block(h)))
    if v1_and_vit:
        v1 = models.MobileViTBlock(channels, 1, num_heads=2, filters=channels,
                                   name="mobilevit_block")(h)
        outputs.append(keras.layers.GlobalAveragePooling2D()(v1))
        tokens = models.PatchEmbedding(4, channels, name="patch_embedding")(x)
        tokens = models.ClassTokenPositionEmbedding(name="class_token_position")(tokens)
        tokens = models.ViTBlock(num_heads=2, name="vit_block")(tokens)
        outputs.append(models.TokenPooling(name="token_pooling")(tokens))
    return keras.Model(x, keras.layers.Concatenate()(outputs), name=f"layer_zoo_{part}")


def mobilevitv2_fused_macs(model: keras.Model) -> int:
    """MACs per image that fusing MobileViTv2's three 1x1 pairs saves, from the Keras layers.

    The pairs: the last linear projection of stages 0, 2 and 3 (`project_conv` of
    `stage0_block0`, `conv_proj` of the MobileViT blocks) and the 1x1 expansion of the next
    stage's first block, at that stage's map size (input / 2 ** (stage + 1)).
    """
    height, width = model.inputs[0].shape[1:3]
    blocks = {layer.name: layer for layer in model._flatten_layers(include_self=False)}

    def convs(block):
        return {layer.name: layer for layer in block._flatten_layers(include_self=False)
                if isinstance(layer, keras.layers.Conv2D)}

    saved = 0
    for first, second, stage in (("stage0_block0", "stage1_block0", 0),
                                 ("stage2_block1", "stage3_block0", 2),
                                 ("stage3_block1", "stage4_block0", 3)):
        a = next(v for k, v in convs(blocks[first]).items() if k in ("project_conv", "conv_proj"))
        b = convs(blocks[second])["expand_conv"]
        assert tuple(a.kernel.shape[:2]) == tuple(b.kernel.shape[:2]) == (1, 1)
        (cin, mid), out = a.kernel.shape[2:], b.kernel.shape[3]
        pixels = -(-height // 2 ** (stage + 1)) * -(-width // 2 ** (stage + 1))
        saved += pixels * (mid * (cin + out) - cin * out)
    return saved


TORCH_READY = all(
    importlib.util.find_spec(m) is not None for m in ("torch", "timm", "safetensors")
)


def float_ops_from_interpreter(path) -> dict[str, int]:
    """Float ops of a .tflite file except the graph input's QUANTIZE and the graph output's
    DEQUANTIZE, computed independently of `TFLiteReport.float_ops`: from the interpreter's
    node list and tensor dtypes (no delegate, so every node is listed as itself)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_path=str(path),
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interpreter.allocate_tensors()
    dtypes = {t["index"]: np.dtype(t["dtype"]) for t in interpreter.get_tensor_details()}
    graph_in = {d["index"] for d in interpreter.get_input_details()}
    graph_out = {d["index"] for d in interpreter.get_output_details()}
    found: dict[str, int] = {}
    for op in interpreter._get_ops_details():
        ins = [t for t in op["inputs"] if t >= 0]
        outs = [t for t in op["outputs"] if t >= 0]
        float_in = {t for t in ins if dtypes[t].kind == "f"}
        float_out = {t for t in outs if dtypes[t].kind == "f"}
        if not float_in and not float_out:
            continue
        if op["op_name"] == "QUANTIZE" and not float_out and float_in <= graph_in:
            continue
        if op["op_name"] == "DEQUANTIZE" and not float_in and float_out <= graph_out:
            continue
        found[op["op_name"]] = found.get(op["op_name"], 0) + 1
    return dict(sorted(found.items()))
