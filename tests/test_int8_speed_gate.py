"""The latency gate's words (`benchmarks/int8_speed.py`): on constructed rows, the verdict
names every row where int8 is not faster than float32, marks them in the table, and says
when the control network (no attention) fails too. Nothing converts or times here."""

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def speed():
    return load_benchmark("int8_speed")


def _row(model: str, size: int, threads: int, float32_ms: float, int8_ms: float) -> dict:
    def ms(value: float) -> dict:
        return {"median": value, "low": 0.95 * value, "high": 1.05 * value}

    ratio = int8_ms / float32_ms
    return {"model": model, "size": size, "threads": threads, "float32": ms(float32_ms),
            "int8": ms(int8_ms), "ratio": ratio, "slower": ratio >= 1.0,
            "int8_file": {"xnnpack_partitions": 1, "ops_outside_xnnpack": {}}}


def test_every_row_faster_passes(speed):
    result = {"gate": [_row("separable", 256, 1, 11.0, 6.0), _row("mobilenetv2_050", 256, 1,
                                                                     4.0, 2.5)]}
    assert speed.verdict(result) == "**Gate: int8 is faster than float32 in every row.**"
    assert "**!**" not in "\n".join(speed.gate_table(result))


def test_slower_rows_are_named_and_marked(speed):
    result = {"gate": [_row("separable", 256, 1, 11.0, 6.0), _row("mha", 256, 2, 8.8, 11.4),
                       _row("rfa", 64, 1, 1.8, 1.8),  # parity is not faster
                       _row("mobilenetv2_050", 256, 1, 4.0, 2.5)]}
    text = speed.verdict(result)
    assert text.startswith("**GATE FAILED")
    assert "mha @256 2 thread(s), rfa @64 1 thread(s).**" in text
    assert "separable" not in text and "control" not in text
    table = speed.gate_table(result)
    assert [line.endswith("**!** | 1 | - |") for line in table[2:]] == [False, True, True,
                                                                        False]


def test_a_failing_control_is_said_to_be_the_cpus(speed):
    result = {"gate": [_row("separable", 256, 1, 13.45, 13.35),
                       _row("mobilenetv2_050", 256, 1, 3.87, 5.32),
                       _row("mobilenetv2_050", 256, 2, 2.25, 3.12)]}
    text = speed.verdict(result)
    assert "mobilenetv2_050 @256 1 thread(s), mobilenetv2_050 @256 2 thread(s).**" in text
    assert ("The control (mobilenetv2_050, no attention) is not faster in int8 either (at "
            "256x256 1 thread(s): 1.37x, 256x256 2 thread(s): 1.39x)") in text
    assert "XNNPACK's int8 kernels are slower than its float32 ones" in text


def test_int8_files_allow_only_the_float_ops_their_attention_declares(speed):
    # The gate times the file a user gets: integer-only unless the attention declares its
    # float islands (RFA's SIN / COS, MHA's and Linformer's SOFTMAX).
    assert {name: speed.declared_float_ops(name) for name in speed.ATTENTIONS} == {
        "separable": False, "mha": True, "linformer": True, "rfa": True,
        "mobile_attention": False}
    assert speed.declared_float_ops(speed.CONTROL) is False
