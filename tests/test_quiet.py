"""What a user sees: no library chatter on import or from `mvit2` (unless -v), and the
README's first command working as root without sudo."""

import os
import subprocess
import sys

import pytest

from keras_mvit2.utils.quiet import _CHATTER, drop_entries

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


#: Written to stdout and stderr once `import keras_mvit2` is done, before the command runs:
#: what comes before it is what the import printed.
IMPORTED = "-- keras_mvit2 imported --\n"


def _mvit2(args: list[str]) -> subprocess.CompletedProcess:
    """`import keras_mvit2`, the marker on both streams, then `mvit2 ARGS`, in a fresh
    process with Python's default warning filters."""
    script = (
        "import sys; import keras_mvit2; "
        f"sys.stdout.write({IMPORTED!r}); sys.stdout.flush(); "
        f"sys.stderr.write({IMPORTED!r}); sys.stderr.flush(); "
        "from keras_mvit2.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": ""})


# `export` builds a model, runs TensorFlow (its runtime's start-up logs), converts to TFLite
# (the converter's prints) and checks the file in LiteRT (the delegate's).
@pytest.fixture(scope="module")
def quiet_export(tmp_path_factory):
    """`mvit2 export` without -v, after a plain `import keras_mvit2` in the same process
    (one process start for both tests that read it): (the run, the file it writes)."""
    path = tmp_path_factory.mktemp("quiet") / "m.tflite"
    return _mvit2(["export", "mobilevitv2_050", "-o", str(path)]), path


@pytest.mark.slow
def test_import_prints_nothing(quiet_export):
    done, _ = quiet_export
    assert done.returncode == 0, done.stderr[-2000:]
    for stream in (done.stdout, done.stderr):  # nothing before the marker on either
        assert stream.startswith(IMPORTED), stream[:2000]


def test_chatter_filter_keeps_warnings_and_errors_that_matter():
    text = (
        "I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.\n"
        "I0000 00:00:1.0 1 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild.\n"
        "E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n"
        "fully_quantize: 0, inference_type: 6\n"
        "E0000 00:00:1.0 1 something.cc:1] a real error\n"
        "mvit2 train: error: Training diverged: the loss became nan\n"
    )
    assert drop_entries(text, _CHATTER) == (
        "E0000 00:00:1.0 1 something.cc:1] a real error\n"
        "mvit2 train: error: Training diverged: the loss became nan\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_cli_is_quiet_unless_verbose(request, tmp_path, verbose):
    if verbose:
        done = _mvit2(["export", "mobilevitv2_050", "-o", str(tmp_path / "m.tflite"), "-v"])
    else:
        done, path = request.getfixturevalue("quiet_export")
    assert done.returncode == 0, done.stderr[-2000:]
    stderr = done.stderr.partition(IMPORTED)[2]  # the command's (the import's: above)
    if verbose:  # the library chatter the quiet mode drops is there (e.g. LiteRT's delegate)
        assert any(_CHATTER.match(line) for line in stderr.splitlines()), done.stderr
    else:
        assert done.stderr == IMPORTED, done.stderr[-2000:]
        assert os.path.exists(path)


def _first_command() -> str:
    text = open(README).read()
    block = text[text.index("```bash\n") + len("```bash\n"):]
    line = next(l for l in block.splitlines() if "apt-get install" in l)  # noqa: E741
    return line.split(" && pip install")[0]


def _fake_bin(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.mark.slow
@pytest.mark.parametrize("uid", ["0", "1000"])
def test_readme_first_command_installs_the_data_as_root_and_with_sudo(tmp_path, uid):
    # Fake dpkg (package missing), apt-get and id; sudo exists only for the non-root user.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _fake_bin(bin_dir, "dpkg", "exit 1")
    _fake_bin(bin_dir, "id", f"echo {uid}")
    _fake_bin(bin_dir, "apt-get", f'echo "apt-get $*" >> {log}')
    if uid != "0":
        _fake_bin(bin_dir, "sudo", f'echo "sudo $*" >> {log}; "$@"')
    env = {"PATH": f"{bin_dir}:/bin:/usr/bin", "HOME": str(tmp_path)}
    # only our fakes and the shell's builtins: no real sudo / apt-get on PATH first
    done = subprocess.run(["/bin/sh", "-c", _first_command()], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert "apt-get install -y dataset-fashion-mnist" in calls, calls
    assert any(c.startswith("sudo apt-get install") for c in calls) == (uid != "0"), calls
