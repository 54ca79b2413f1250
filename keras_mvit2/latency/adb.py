"""The phone over ``adb``: `Adb` (every adb call goes through `Adb.run`), the device's
properties (`parse_getprop`, `device_info`) and the check that the ``benchmark_model``
binary was built for its ABI."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

#: Where to get the binary (printed by the command line and its errors).
BENCHMARK_MODEL_HELP = """\
benchmark_model is the official TFLite benchmark tool (a native command-line binary,
not the benchmark .apk). Get the build for your phone's CPU from the LiteRT
performance-measurement page (https://ai.google.dev/edge/litert/models/measurement,
section "Native benchmark binary"), nightly prebuilt binaries:
  64-bit phones (ABI arm64-v8a):   android_aarch64_benchmark_model
  32-bit phones (ABI armeabi-v7a): android_arm_benchmark_model
  https://storage.googleapis.com/tensorflow-nightly-public/prod/tensorflow/release/lite/tools/nightly/latest/<name>
or build it from source with bazel and the Android NDK configured:
  bazel build -c opt --config=android_arm64 //tensorflow/lite/tools/benchmark:benchmark_model
  (TensorFlow repository; in the LiteRT repository the target is
  //tflite/tools/benchmark:benchmark_model), then pass
  bazel-bin/tensorflow/lite/tools/benchmark/benchmark_model.
The phone's ABI: adb shell getprop ro.product.cpu.abi"""

ADB_HELP = (
    "Install Android SDK Platform-Tools (https://developer.android.com/tools/releases/"
    "platform-tools) and put adb on PATH, or pass --adb PATH."
)
USB_DEBUGGING_HELP = (
    "Connect the phone by USB and enable USB debugging: Settings > About phone > tap "
    "'Build number' 7 times, then Settings > System > Developer options > USB debugging; "
    "accept the 'Allow USB debugging?' prompt on the phone."
)


class AndroidBenchError(OSError):
    """adb or benchmark_model failed; the message says what to do."""


class Adb:
    """Runs ``adb [-s SERIAL] ...``: every adb call of the Android harness goes through `run`."""

    def __init__(self, executable: str = "adb", serial: str | None = None,
                 timeout: float = 900.0):
        resolved = shutil.which(executable)
        if resolved is None:
            raise AndroidBenchError(f"adb not found ({executable!r}). {ADB_HELP}")
        self.executable = resolved
        self.serial = serial
        self.timeout = timeout

    def run(self, *args: str, check: bool = True, device: bool = True,
            timeout: float | None = None) -> str:
        """Runs adb with `args` (for the selected device unless ``device=False``) and
        returns its standard output; raises `AndroidBenchError` on a non-zero exit."""
        command = [self.executable]
        if device and self.serial:
            command += ["-s", self.serial]
        command += list(args)
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout or self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise AndroidBenchError(
                f"`{shlex.join(command)}` did not finish in {err.timeout:.0f} s."
            ) from err
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise AndroidBenchError(
                f"`{shlex.join(command)}` failed (exit {proc.returncode}): "
                + (" | ".join(detail) or "no output")
            )
        return proc.stdout

    def shell(self, command: str, **kwargs: Any) -> str:
        return self.run("shell", command, **kwargs)

    def push(self, local: str | os.PathLike, remote: str) -> None:
        self.run("push", os.fspath(local), remote)

    def pull(self, remote: str, local: str | os.PathLike) -> None:
        self.run("pull", remote, os.fspath(local))

    def select_device(self) -> str:
        """Checks the attached devices and fixes `serial` (the only one, or the given one)."""
        listing = self.run("devices", device=False)
        states: dict[str, str] = {}
        for line in listing.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1]
        if self.serial is not None:
            state = states.get(self.serial)
            if state is None:
                raise AndroidBenchError(
                    f"Device {self.serial!r} is not attached (adb devices lists "
                    f"{sorted(states) or 'nothing'}). {USB_DEBUGGING_HELP}"
                )
        else:
            if not states:
                raise AndroidBenchError(f"No Android device found by `adb devices`. "
                                        f"{USB_DEBUGGING_HELP}")
            if len(states) > 1:
                raise AndroidBenchError(
                    f"Several devices are attached ({', '.join(sorted(states))}); "
                    "pass --serial with one of them."
                )
            self.serial, state = next(iter(states.items()))
        if state == "unauthorized":
            raise AndroidBenchError(
                f"Device {self.serial} is unauthorized: unlock it and accept the 'Allow USB "
                "debugging?' prompt, then run again."
            )
        if state != "device":
            raise AndroidBenchError(
                f"Device {self.serial} is {state!r}, not ready. Reconnect the cable or run "
                "`adb kill-server`, then run again."
            )
        return self.serial


_GETPROP_LINE = re.compile(r"^\[(?P<key>[^\]]+)\]: \[(?P<value>.*)\]\s*$")


def parse_getprop(text: str) -> dict[str, str]:
    """Parses ``adb shell getprop`` (``[key]: [value]`` lines)."""
    props = {}
    for line in text.splitlines():
        if match := _GETPROP_LINE.match(line.strip()):
            props[match.group("key")] = match.group("value")
    return props


def device_info(props: dict[str, str]) -> dict[str, Any]:
    """The record's ``device`` dict from getprop: model name, Android version, SoC."""
    soc_model = props.get("ro.soc.model", "")
    soc_maker = props.get("ro.soc.manufacturer", "")
    soc = " ".join(p for p in (soc_maker, soc_model) if p) or next(
        (props[k] for k in ("ro.hardware.chipname", "ro.board.platform", "ro.hardware")
         if props.get(k)), "unknown",
    )
    release = props.get("ro.build.version.release", "?")
    sdk = props.get("ro.build.version.sdk", "?")
    return {
        "name": props.get("ro.product.model") or "unknown Android device",
        "platform": "android",
        "machine": props.get("ro.product.cpu.abi", "unknown"),
        "os": f"Android {release} (API {sdk})",
        "cpu": soc,
        "manufacturer": props.get("ro.product.manufacturer", ""),
        "device": props.get("ro.product.device", ""),
        "build": props.get("ro.build.id", ""),
    }


_ELF_MACHINES = {3: "x86", 40: "32-bit ARM", 62: "x86-64", 183: "AArch64 (64-bit ARM)"}
_ABI_MACHINES = {"arm64-v8a": 183, "armeabi-v7a": 40, "armeabi": 40, "x86_64": 62, "x86": 3}


def check_binary_for_device(path: Path, props: dict[str, str]) -> None:
    """Raises when `path` is not an ELF executable for one of the phone's ABIs."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        hint = " (an .apk is the benchmark app, not the binary)" if head[:2] == b"PK" else ""
        raise AndroidBenchError(
            f"{path} is not a native executable (no ELF header){hint}.\n{BENCHMARK_MODEL_HELP}"
        )
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    abis = [a for a in props.get("ro.product.cpu.abilist", "").split(",") if a]
    abis = abis or [props.get("ro.product.cpu.abi", "")]
    wanted = {_ABI_MACHINES[a] for a in abis if a in _ABI_MACHINES}
    if wanted and machine not in wanted:
        built = _ELF_MACHINES.get(machine, f"ELF machine {machine}")
        raise AndroidBenchError(
            f"{path} is built for {built}, but the phone runs {', '.join(abis)}: use "
            "android_aarch64_benchmark_model for arm64-v8a (android_arm_benchmark_model for "
            f"armeabi-v7a).\n{BENCHMARK_MODEL_HELP}"
        )
