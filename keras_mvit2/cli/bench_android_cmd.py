"""`mvit2 bench-android`: TFLite models on an Android phone (`benchmark_model` over adb)."""

import argparse


def register(sub) -> None:
    from keras_mvit2.latency import android

    p = sub.add_parser(
        "bench-android",
        help="benchmark .tflite models on an Android phone (benchmark_model over adb)",
        epilog=android.BENCHMARK_MODEL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    android.add_arguments(p)
    p.set_defaults(handler=android.run_from_args)
