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

Every backend trains with the same recipe (see `keras_mvit2.training.trainer`);
`ClassifierTrainer`, TensorFlow's train step, is importable on TensorFlow only.
"""

from keras_mvit2.backend import variants
from keras_mvit2.training.callbacks import EMAUpdate
from keras_mvit2.training.classifier import build_classifier, build_inference_model
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
from keras_mvit2.training.evaluation import EvalResult, evaluate
from keras_mvit2.training.keras_distribution import KerasDistribution
from keras_mvit2.training.keras_trainer import KerasClassifierTrainer
from keras_mvit2.training.records import TrainResult
from keras_mvit2.training.report import plot_confusion_matrix, write_eval_report
from keras_mvit2.training.run_data import make_sources
from keras_mvit2.training.run_folder import RunPlan, SchedulePlan, latest_checkpoint
from keras_mvit2.training.schedules import ReplannedCosineDecay, WarmupCosineDecay
from keras_mvit2.training.trainer import build_trainer, finetune, train

if variants().tensorflow_train_step:  # keras_mvit2.backend.variants
    from keras_mvit2.training.train_step import ClassifierTrainer

__all__ = [
    "ClassifierTrainer",
    "DataConfig",
    "EMAConfig",
    "EMAUpdate",
    "EvalResult",
    "ExponentialMovingAverage",
    "KerasClassifierTrainer",
    "KerasDistribution",
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

if not variants().tensorflow_train_step:
    __all__.remove("ClassifierTrainer")


def __getattr__(name: str):
    if name == "ClassifierTrainer":  # only reached off the TensorFlow backend
        from keras_mvit2.backend import require_tensorflow

        require_tensorflow("keras_mvit2.training.ClassifierTrainer (the TensorFlow train "
                           "step; KerasClassifierTrainer trains on every backend)")
    raise AttributeError(f"module 'keras_mvit2.training' has no attribute {name!r}")
