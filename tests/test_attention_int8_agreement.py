"""`benchmarks/attention_int8_agreement.py`: its paired test and its table (the trainings and
conversions are the benchmark's run, not a test's)."""

import numpy as np
from benchmark_scripts import load_benchmark

bench = load_benchmark("attention_int8_agreement")


def test_paired_counts_the_discordant_images_and_tests_them_exactly():
    a = np.array([True] * 8 + [False] + [True] * 5 + [False] * 2)
    b = np.array([False] * 8 + [True] + [True] * 5 + [False] * 2)
    result = bench.paired({"int8": a, "int8 integer-only": b})
    assert result["only_agrees"] == {"int8": 8, "int8 integer-only": 1}
    # two-sided exact binomial test of 8 of 9 at 1/2: 2 * (C(9,8) + C(9,9)) / 2^9
    assert abs(result["p_value"] - 2 * (9 + 1) / 512) < 1e-12
    same = bench.paired({"int8": a, "int8 integer-only": a})
    assert same == {"only_agrees": {"int8": 0, "int8 integer-only": 0}, "p_value": 1.0}


def test_wilson_interval_holds_the_proportion_and_stays_in_0_1():
    low, high = bench.wilson(100, 100)
    assert 0.96 < low < 1.0 and abs(high - 1.0) < 1e-9
    low, high = bench.wilson(50, 100)
    assert low < 0.5 < high and abs((0.5 - low) - (high - 0.5)) < 1e-9


def test_markdown_has_every_file_the_refusal_and_the_paired_rows():
    files = {"int8": {"float_ops": {"SOFTMAX": 6}, "top1": 0.8, "agreement": 0.97,
                      "agreement_interval": (0.95, 0.98), "logit_rel_error": 0.1},
             "int8 integer-only": {"float_ops": {}, "top1": 0.79, "agreement": 0.96,
                                   "agreement_interval": (0.94, 0.97),
                                   "logit_rel_error": 0.12}}
    result = {"settings": {"size": 64, "train_images": 100, "epochs": 1, "test_images": 50,
                           "seed": 0},
              "code": "abc", "cpu": "cpu", "timestamp": "t",
              "rows": [{"attention": "mha", "keras_top1": 0.81, "files": files,
                        "paired": {"only_agrees": {"int8": 3, "int8 integer-only": 1},
                                   "p_value": 0.625}},
                       {"attention": "rfa", "keras_top1": 0.8,
                        "files": {"int8 integer-only": {"error": "RuntimeError: SIN x18"}}}]}
    text = bench.markdown(result)
    assert "| mha | int8 | SOFTMAX 6 | 81.0 % | 80.0 % | 97.0 % [95.0, 98.0] | 0.100 |" in text
    assert "| mha | int8 integer-only | none |" in text
    assert "| rfa | int8 integer-only | | | | does not convert: RuntimeError: SIN x18 | |" in text
    assert "| mha | 3 | 1 | 0.62 |" in text
