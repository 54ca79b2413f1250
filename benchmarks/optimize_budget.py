"""Ship to a budget, measured: every candidate of `mvit2 optimize` and the choice per budget.

    python benchmarks/optimize_budget.py MODEL.keras [MODEL.keras ...] [--data fashion_mnist]
        [--targets tflite coreml] [--budgets 0.5 0.1] [--num-held-out 500] [--out DIR]

For each model and target it runs `keras_mvit2.optimizer.optimize` once (every candidate
built and measured on the same held-out images: LiteRT for TFLite, Keras with the
package's own decompressed weights for Core ML), then applies each budget to those
measurements with the optimizer's own rule (`best_within`). Writes
``optimize_budget.json``, ``optimize_budget.md`` (one table per model and target, the
chosen candidate per budget) and each run's Pareto plot as
``optimize_budget_<model>_<target>.png`` to ``--out`` (default ``benchmarks/results/``).

The models of the tables in docs/budget.md (Fashion-MNIST, 2 CPU cores):

    mvit2 train --config fashion_mnist --set model.image_size=64 --set training.epochs=3 \\
        --set training.steps_per_epoch=300 -o runs/fm64
    mvit2 finetune ... (see docs/budget.md for the 256x256 model)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help=".keras classifiers")
    parser.add_argument("--data", default="fashion_mnist")
    parser.add_argument("--targets", nargs="+", default=["tflite", "coreml"])
    parser.add_argument("--budgets", nargs="+", type=float, default=[0.5, 0.1])
    parser.add_argument("--num-held-out", type=int, default=500)
    parser.add_argument("--latency-runs", type=int, default=50)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)

    import keras

    import keras_mvit2  # noqa: F401  (registers the layers)
    from keras_mvit2.optimizer import OverBudgetError, best_within, optimize
    from keras_mvit2.optimizer.report import speed_text

    os.makedirs(args.out, exist_ok=True)
    runs = []
    for model_path in args.models:
        model = keras.saving.load_model(model_path, compile=False)
        size = tuple(model.inputs[0].shape[1:3])
        label = f"{os.path.basename(os.path.dirname(os.path.abspath(model_path)))}_{size[0]}"
        for target in args.targets:
            with tempfile.TemporaryDirectory() as folder:
                started = time.perf_counter()
                try:
                    result = optimize(model, folder, target=target, data=args.data,
                                      max_drop=max(args.budgets),
                                      num_held_out=args.num_held_out,
                                      latency_runs=args.latency_runs)
                except OverBudgetError as err:
                    result = err.result
                seconds = time.perf_counter() - started
                plot = None
                if result.plot_path:
                    plot = os.path.join(args.out, f"optimize_budget_{label}_{target}.png")
                    shutil.copyfile(result.plot_path, plot)
            choices = {}
            for budget in args.budgets:
                best = best_within(result.candidates, budget, result.objective)
                choices[str(budget)] = None if best is None else best.name
            run = result.to_dict()
            for candidate, measured in zip(run["candidates"], result.candidates, strict=True):
                candidate["path"] = os.path.basename(candidate["path"] or "") or None
                candidate["speed_text"] = speed_text(measured)  # "1.32x, slower"
            run.update(model=model_path, model_name=model.name, input_size=list(size),
                       label=label, choices=choices, plot=plot, seconds=round(seconds, 1))
            for key in ("best", "best_path", "report_path", "plot_path"):
                run.pop(key, None)
            runs.append(run)
            print(_table(run), flush=True)
    record = {"runs": runs, "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                                     "load_1min": os.getloadavg()[0]},
              "command": " ".join(sys.argv)}
    with open(os.path.join(args.out, "optimize_budget.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(args.out, "optimize_budget.md"), "w") as f:
        f.write("\n\n".join(_table(run) for run in runs) + "\n")
    return 0


def _table(run: dict) -> str:
    """One model x target as a markdown table, the choice per budget under it."""
    lines = [f"**{run['model_name']} {run['input_size'][0]}x{run['input_size'][1]}, "
             f"{run['target']}**: float Keras top-1 {100 * run['reference_top1']:.2f} % on "
             f"{run['data']['num_held_out']} held-out images "
             f"({run['data']['num_calibration']} other images calibrate)", "",
             "| candidate | bytes | top-1 % | agreement % | drop (points) | ms | vs float32 "
             "| measured by |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for c in run["candidates"]:
        if c["error"]:
            lines.append(f"| {c['name']} | | | | | | | failed: {c['error'][:80]} |")
            continue
        speed = c.get("speed_text", "")
        def pct(v):
            return "" if v is None else f"{100 * v:.2f}"
        lines.append(
            f"| {c['name']} | {c['size_bytes']:,} | {pct(c['top1'])} | {pct(c['agreement'])} | "
            + ("" if c["drop_points"] is None else f"{c['drop_points']:+.2f}") + " | "
            + ("" if c["latency_ms"] is None else f"{c['latency_ms']:.2f}") + " | "
            + speed + " | "
            + (c["measured_by"] + ("" if c["exact"] else " (approx.)") if c["top1"] is not None
               else "not measurable here: " + (c["note"] or "")) + " |")
    lines.append("")
    lines.append(f"chosen (objective {run['objective']}): " + ", ".join(
        f"`--max-drop {b}` -> {name or 'none within budget'}"
        for b, name in run["choices"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
