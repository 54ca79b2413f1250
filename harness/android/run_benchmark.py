#!/usr/bin/env python3
"""Benchmarks .tflite models on an Android phone with the official TFLite
`benchmark_model` over adb and writes keras_mvit2.bench/1 records (JSON) and a table.

Same as `python -m keras_mvit2.latency.android` (see harness/README.md); run with
`--help` for the options and where to get `benchmark_model`. Example:

    python harness/android/run_benchmark.py mobilevitv2_050_float32.tflite \\
        --benchmark-model ~/Downloads/android_aarch64_benchmark_model \\
        --delegate xnnpack gpu --threads 1 4 -o pixel7.json
"""

import sys
from pathlib import Path

try:
    from keras_mvit2.latency.android import main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from keras_mvit2.latency.android import main

if __name__ == "__main__":
    sys.exit(main())
