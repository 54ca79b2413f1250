"""Training with the MobileViTv2 recipe: configs, `train`, `finetune`, `evaluate`.

```python
from keras_mvit2 import training

config = training.load_config("fashion_mnist", overrides=["training.epochs=2"])
result = training.train(config)          # resumes from config.output.dir if it holds a run
print(result.metrics["ema"].top1, result.model_path)
```

Packaged configs (`training.packaged_configs()`): the paper's ImageNet-1k recipe per width
(`imagenet_mobilevitv2_050` ... `_200`, Table 9 / ml-cvnets), fine-tuning at 384
(`imagenet_finetune_384`, Table 10), a small-data fine-tuning recipe
(`finetune_small_data`) and the built-in Fashion-MNIST example (`fashion_mnist`).
`write_eval_report` / `plot_confusion_matrix` save an `EvalResult` as JSON and a PNG.
What `train` does with a run folder that already holds a run (resume, already complete,
refused when the length or schedule changed unless `replan=True`) is
`keras_mvit2.training.run_folder`.
"""

# TensorFlow-only: on JAX / PyTorch, a clear error instead of loading TensorFlow.
from keras_mvit2.utils.backend import require_tensorflow

require_tensorflow("keras_mvit2.training (training and fine-tuning)")

from keras_mvit2.training.config import (
    DataConfig,
    EMAConfig,
    ModelConfig,
    MultiScaleConfig,
    OptimizerConfig,
    OutputConfig,
    ScheduleConfig,
    TrainConfig,
    TrainingConfig,
    apply_overrides,
    load_config,
    packaged_configs,
)
from keras_mvit2.training.distribute import (
    Scaling,
    is_chief,
    make_strategy,
    resolve_precision,
    scale_for_replicas,
)
from keras_mvit2.training.divergence import StopOnNonFiniteLoss, TrainingDivergedError
from keras_mvit2.training.ema import ExponentialMovingAverage
from keras_mvit2.training.report import plot_confusion_matrix, write_eval_report
from keras_mvit2.training.run_folder import RunPlan, SchedulePlan, latest_checkpoint
from keras_mvit2.training.schedules import ReplannedCosineDecay, WarmupCosineDecay
from keras_mvit2.training.trainer import (
    ClassifierTrainer,
    EvalResult,
    TrainResult,
    build_classifier,
    build_inference_model,
    build_trainer,
    evaluate,
    finetune,
    make_sources,
    train,
)

__all__ = [
    "ClassifierTrainer",
    "DataConfig",
    "EMAConfig",
    "EvalResult",
    "ExponentialMovingAverage",
    "ModelConfig",
    "MultiScaleConfig",
    "OptimizerConfig",
    "OutputConfig",
    "ReplannedCosineDecay",
    "RunPlan",
    "Scaling",
    "ScheduleConfig",
    "SchedulePlan",
    "StopOnNonFiniteLoss",
    "TrainConfig",
    "TrainResult",
    "TrainingConfig",
    "TrainingDivergedError",
    "WarmupCosineDecay",
    "apply_overrides",
    "build_classifier",
    "build_inference_model",
    "build_trainer",
    "evaluate",
    "finetune",
    "is_chief",
    "latest_checkpoint",
    "load_config",
    "make_sources",
    "make_strategy",
    "packaged_configs",
    "plot_confusion_matrix",
    "resolve_precision",
    "scale_for_replicas",
    "train",
    "write_eval_report",
]
