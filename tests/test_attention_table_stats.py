"""The statistics and the report of `benchmarks/attention_table.py` (Table 1 with error bars).

Pure functions on synthetic records: the paired t interval against a numpy transcription
with the t quantiles from a printed table, the median's order-statistic interval against
exact binomial sums, the verdicts at their boundaries, and the markdown / plot of a table
with missing, diverged and untimed entries. Nothing trains or converts here.
"""

import argparse
import json
import math
import types

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _t_quantile(p: float, df: int) -> float:
    """Student t quantile from its closed forms for 2 and 4 degrees of freedom (not from
    scipy)."""
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    alpha = 4 * p * (1 - p)  # df == 4
    q = math.cos(math.acos(math.sqrt(alpha)) / 3) / math.sqrt(alpha)
    return math.copysign(2 * math.sqrt(q - 1), p - 0.5)


T_975 = {df: _t_quantile(0.975, df) for df in (2, 4)}


at = load_benchmark("attention_table")


@pytest.mark.parametrize("a, b", [
    ({0: 87.40, 1: 88.05, 2: 87.62, 3: 90.0}, {0: 87.71, 1: 87.20, 2: 88.31}),
    ({0: 1.0, 1: 2.5, 2: -0.5, 3: 0.25, 4: 3.0}, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}),
])
def test_paired_interval_matches_a_numpy_transcription(a, b):
    seeds = sorted(set(a) & set(b))  # seed 3 of the first case has no partner: left out
    d = np.array([a[s] - b[s] for s in seeds])
    n = len(d)
    mean = d.sum() / n
    sd = math.sqrt(((d - mean) ** 2).sum() / (n - 1))
    half = T_975[n - 1] * sd / math.sqrt(n)

    got = at.paired_interval(a, b)

    assert got["n"] == n and got["seeds"] == seeds
    np.testing.assert_allclose(got["differences"], d)
    np.testing.assert_allclose([got["mean"], got["std"], got["t"]], [mean, sd, T_975[n - 1]],
                               rtol=1e-12)
    np.testing.assert_allclose([got["low"], got["high"]], [mean - half, mean + half],
                               rtol=1e-12)
    assert f"{n} per-seed differences" in got["method"]


def test_paired_interval_needs_two_paired_seeds():
    got = at.paired_interval({0: 88.0, 1: 87.0}, {0: 87.5})
    assert (got["n"], got["mean"], got["std"], got["low"], got["high"]) == (
        1, 0.5, None, None, None)
    assert at.paired_interval({}, {0: 1.0})["mean"] is None


def test_seed_statistics_mean_and_sample_std():
    got = at.seed_statistics({2: 88.1, 0: 87.4, 1: 87.9})
    x = np.array([87.4, 87.9, 88.1])
    assert got["seeds"] == [0, 1, 2] and got["values"] == [87.4, 87.9, 88.1]
    np.testing.assert_allclose(
        [got["mean"], got["std"]],
        [x.sum() / 3, math.sqrt(((x - x.sum() / 3) ** 2).sum() / 2)], rtol=1e-12)
    assert at.seed_statistics({0: 87.4})["std"] is None


def test_median_interval_is_the_binomial_order_statistics():
    x = np.random.default_rng(3).gamma(4.0, 2.0, size=40)
    n = len(x)
    # The largest k with P(B <= k - 1) <= 0.025, B ~ Binomial(n, 1/2): [x_(k), x_(n-k+1)].
    below = [sum(math.comb(n, i) for i in range(j + 1)) / 2**n for j in range(n)]
    k = max(j + 1 for j in range(n) if below[j] <= 0.025)
    ordered = np.sort(x)
    low, high = at.median_interval(x)
    assert (low, high) == (ordered[k - 1], ordered[n - k])
    assert 1 - 2 * below[k - 1] >= 0.95 and k == 14
    assert at.median_interval([1.0, 2.0, 3.0]) == (None, None)  # too few for 95 %


@pytest.mark.parametrize("low, high, band_verdict, sign_verdict", [
    (-0.5, 0.3, "holds", "cannot be told apart"),
    (-0.9, -0.1, "holds", "lower"),
    (0.1, 0.29, "holds", "higher"),
    (0.2, 0.9, "cannot be told apart", "higher"),
    (0.31, 1.2, "does not hold", "higher"),
    (None, None, "not measured", "not measured"),
])
def test_verdicts_at_their_boundaries(low, high, band_verdict, sign_verdict):
    assert at.band_verdict(low, high, 0.3) == band_verdict
    assert at.sign_verdict(low, high) == sign_verdict


def test_fastest_verdict():
    def ms(low, high):
        return {"median": (low + high) / 2, "low": low, "high": high, "clock": "cpu"}

    assert at.fastest_verdict(ms(5, 6), {"mha": ms(6.5, 7), "rfa": None}) == "holds"
    assert at.fastest_verdict(ms(5, 6), {"mha": ms(5.9, 7)}) == "cannot be told apart"
    assert at.fastest_verdict(ms(5, 6), {"mha": ms(8, 9), "x": ms(4, 4.9)}) == "does not hold"
    assert at.fastest_verdict(None, {"mha": ms(6, 7)}) == "not measured"
    assert at.fastest_verdict(ms(5, 6), {"rfa": None}) == "not measured"


def test_a_record_of_other_settings_is_refused(tmp_path):
    config = {"model": {"attention": "mha"}, "data": {"seed": 0}, "training": {"seed": 0},
              "output": {"dir": "/elsewhere", "verbose": 0}}
    path = tmp_path / "mha.json"
    path.write_text(json.dumps({"status": "trained", "config": config}))
    same = types.SimpleNamespace(to_dict=lambda: {**config, "output": {"dir": "x"}})
    assert at.load_record(str(path), same)["status"] == "trained"  # `output` may differ
    other = types.SimpleNamespace(to_dict=lambda: {**config, "data": {"seed": 1000}})
    with pytest.raises(ValueError, match=r"other settings \(data.seed\).*another --run-dir"):
        at.load_record(str(path), other)
    assert at.load_record(str(tmp_path / "missing.json"), same) is None


def _record(mechanism, seed, raw, ema, status="trained"):
    record = {"mechanism": mechanism, "seed": seed, "status": status,
              "history": [{"step": 10, "loss": 2.0 - raw / 100}, {"step": 20, "loss": 1.0}],
              "environment": {"cpu": "AMD EPYC", "cores": 2, "tensorflow": "2.21.0",
                              "keras": "3.15.1", "training_threads": 2, "git_commit": "abc"}}
    if status == "trained":
        record.update(top1={"raw": raw / 100, "ema": ema / 100}, train_minutes=12.0,
                      images_per_second=100.0, optimizer_steps=944, test_images=10000)
    else:
        record.update(error="loss became NaN at step 50\nmore")
    return record


def _latency(medians):
    """A latency section: `medians[(mechanism, size, threads, precision)] = (median, low,
    high)`; rfa's int8 file at 256 failed."""
    mechanisms = {}
    for (m, size, threads, precision), (median, low, high) in medians.items():
        entry = mechanisms.setdefault(m, {
            "weights": "trained, seed 0" if m != "rfa" else "random initialisation (no "
            "trained model yet)", "failed": {}, "files": {},
            "cost": {"64": {"params": 1.1e6, "macs": 29e6, "layers_not_copied": []},
                     "256": {"params": 1.1e6, "macs": 465e6, "layers_not_copied": []}}})
        entry["files"].setdefault(str(size), {}).setdefault(str(threads), {})[precision] = {
            "extra": {"median_ms": median, "median_interval_ms": [low, high],
                      "clock": "cpu" if threads == 1 else "wall"}}
    mechanisms["rfa"]["failed"]["256 int8"] = "failed to run once in ai_edge_litert: DIV"
    return {"machine": "AMD EPYC, 2 cores", "timestamp": "2026-12-02T00:00:00+00:00",
            "cpu": {"model": "AMD EPYC", "flags": ["avx2", "avx512_vnni"],
                    "flags_checked": ["avx2", "avx512_vnni", "amx_int8"]},
            "settings": {"sizes": [64, 256], "threads": [1, 2], "runs": 60, "rounds": 10,
                         "warmup": 5},
            "mechanisms": mechanisms}


def test_report_of_a_partial_table(tmp_path):
    """Three seeds of separable and mha, one of rfa (and one diverged), none of linformer:
    the means, the intervals, the missing runs and the claims come out of the data."""
    args = at.parse_args(["--mechanisms", "separable", "mha", "linformer", "rfa",
                          "--out", str(tmp_path)])
    records = [_record("separable", s, raw, raw - 0.1)
               for s, raw in zip((0, 1, 2), (87.40, 87.90, 87.60), strict=True)]
    records += [_record("mha", s, raw, raw)
                for s, raw in zip((0, 1, 2), (87.71, 88.40, 88.00), strict=True)]
    records += [_record("rfa", 0, 87.01, 86.97), _record("rfa", 1, 0, 0, status="diverged")]
    medians = {}
    for m, fp32, int8 in (("separable", 10.0, 5.0), ("mha", 15.0, 11.0),
                          ("linformer", 20.0, 80.0), ("rfa", 17.0, None)):
        for size, scale in ((64, 0.1), (256, 1.0)):
            for threads in (1, 2):
                medians[(m, size, threads, "float32")] = (
                    fp32 * scale, 0.98 * fp32 * scale, 1.02 * fp32 * scale)
                if int8 is not None and not (m == "rfa" and size == 256):
                    medians[(m, size, threads, "int8")] = (
                        int8 * scale, 0.98 * int8 * scale, 1.02 * int8 * scale)
    medians[("rfa", 64, 1, "int8")] = (0.9, 0.88, 0.92)
    table = at.build_table(args.mechanisms, records, _latency(medians), args)

    mha = table["summary"]["mha"]["minus_separable"]["raw"]
    d = np.array([0.31, 0.50, 0.40])
    half = T_975[2] * d.std(ddof=1) / math.sqrt(3)
    np.testing.assert_allclose([mha["low"], mha["high"]], [d.mean() - half, d.mean() + half])
    assert table["summary"]["rfa"]["diverged_seeds"] == [1]
    assert table["summary"]["rfa"]["minus_separable"]["raw"]["low"] is None  # n = 1

    text = at.markdown(table)
    assert "| separable | 3 | 87.63 +- 0.25 |" in text
    assert (f"| mha | 3 | 88.04 +- 0.35 | 88.04 +- 0.35 | +0.40 [{d.mean() - half:+.2f}, "
            f"{d.mean() + half:+.2f}] |") in text
    assert "| linformer | 0 (not trained yet) | - |" in text
    assert "| rfa | 1 (1 diverged) | 87.01 |" in text
    # Training minutes from the throughput, not the segments' wall time: 944 steps of 64
    # images at 100 images / second.
    assert f"| {944 * 64 / 100 / 60:.1f} | 100 |" in text.split("| separable |")[1]
    assert "- rfa seed 1: diverged (loss became NaN at step 50)" in text
    assert ("not trained yet: linformer seed 0, linformer seed 1, linformer seed 2, "
            "rfa seed 2") in text
    assert "| separable | 256 | trained | 10.00 | 5.00 | 0.50x | 10.00 | 5.00 | 0.50x |" in text
    assert "| rfa | 256 | random | 17.00 | - | - | 17.00 | - | - |" in text
    assert "- rfa 256 int8: no latency, failed to run once" in text
    # mha - separable lies in [0.17, 0.63]: above 0, across the 0.3 band.
    assert ("separable loses at most 0.3 points of top-1 to mha (paper: 78.1 against 78.4): "
            "top-1 raw: cannot be told apart") in text
    assert "more accurate than separable: mha" in text
    assert "fewer than 2 paired seeds: linformer, rfa" in text
    assert ("separable is the fastest, int8 at 256x256: 1 thread(s): holds (separable 5.00 "
            "ms, fastest other mha 11.00 ms) [not timed: rfa]") in text
    assert "flags that matter to XNNPACK: avx2, avx512_vnni" in text

    at.plot(table, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC
    no_latency = at.build_table(args.mechanisms, records, None, args)
    assert "Latency: not measured yet" in at.markdown(no_latency)
    assert not any(c["claim"].startswith("separable is the fastest")
                   for c in no_latency["claims"])
    at.plot(no_latency, str(tmp_path / "u.png"))


def test_the_seeds_are_checked():
    with pytest.raises(SystemExit):
        at.parse_args(["--seeds", "0", "0"])
    assert isinstance(at.parse_args([]), argparse.Namespace)
    assert at.parse_args([]).seeds == [0, 1, 2]
