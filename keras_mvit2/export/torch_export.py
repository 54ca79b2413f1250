"""The model's inference call captured by ``torch.export``: one implementation for every
PyTorch road that starts from an ``ExportedProgram`` (Core ML through coremltools,
`keras_mvit2.export.coreml.torch_road`; Core AI through coreai-torch,
`keras_mvit2.export.coreai`).

Forms: MobileViTv2 blocks are traced in the channels-first layout of Apple's runtimes
(`keras_mvit2.export.coreml.layout`: no layout transposes in the transformer) and the other
attentions pool tokens element-wise (`keras_mvit2.layers.export_forms.FLOAT_RUNTIME`, the
form float runtimes get). TensorFlow-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

__all__ = ["torch_program"]


def torch_program(model: keras.Model, shape: tuple[int, ...], *, add_softmax: bool,
                  decompositions: Mapping[Any, Any] | None = None) -> Any:
    """The model's inference call as a decomposed ``torch.export.ExportedProgram``.

    Args:
        model: a Keras model on the PyTorch backend.
        shape: its input ``(H, W, C)``; the program's input is ``image``, ``(1, H, W, C)``
            float32.
        add_softmax: append a softmax over the last axis.
        decompositions: the decomposition table of ``run_decompositions`` (None: PyTorch's
            core ATen table, what coremltools takes).

    Returns:
        The exported program on the CPU, holding copies of the model's weights (converting
        it leaves the model as it was).
    """
    import torch

    from keras_mvit2.backend.keras_internals import torch_device, torch_device_scope
    from keras_mvit2.export.coreml.layout import coreml_tracing

    class Serve(torch.nn.Module):
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            y = self.net(image, training=False)
            return torch.softmax(y, dim=-1) if add_softmax else y

    device = torch_device()
    if device != "cpu":  # as Keras' own export: the program's constants on the CPU
        for v in model.variables:
            v.value.data = v.value.data.to("cpu")
    try:
        with torch_device_scope("cpu"), coreml_tracing():
            serve = Serve(model).eval()
            program = torch.export.export(serve, (torch.zeros((1, *shape)),))
        program = program.run_decompositions(decompositions)
        # The program's weights are the model's own tensors, and coremltools' graph passes
        # edit the arrays they read in place (folding a batch norm into a convolution
        # rewrote the model's moving means): the program gets copies.
        for table in (program.state_dict, program.constants):
            for name, value in list(table.items()):
                if isinstance(value, torch.Tensor):
                    table[name] = value.detach().clone()
        return program
    finally:
        if device != "cpu":
            for v in model.variables:
                v.value.data = v.value.data.to(device)
