"""The generic half of porting and publishing weights: reading PyTorch checkpoints
(`torch_checkpoint`), the layout transforms and the strict check shared by every port
(`port`), one published checkpoint's description (`pretrained.PretrainedWeights`), and
downloading and caching it (`download`).

This sub-package stands below `keras_mvit2.models` and imports only `utils`; each model
family keeps its own port and table beside its builders, and porting any keras_mvit2 model
is `keras_mvit2.models.torch_weights.load_torch_weights` (`mv.load_torch_weights`).
"""

from keras_mvit2.weights.torch_checkpoint import read_torch_state_dict

__all__ = ["read_torch_state_dict"]
