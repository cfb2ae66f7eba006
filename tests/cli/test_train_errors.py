"""Bad input to `globaldl train`: one clear line naming the value, exit code 2, no partial files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def _train(venv_bin: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_bin / "globaldl"), "train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("globaldl: error:")]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "vgg16"], "model 'vgg16' is not one of: lenet, resnet, mlp, video"),
        (
            ["--dataset", "imagenet"],
            "dataset 'imagenet' is not one of: mnist, digits, cifar-synthetic, moving-mnist",
        ),
        (
            ["--quantize", "int3"],
            "quantize='int3' is not valid; allowed: "
            "['none', 'fp16', 'int8', 'qsgd', 'terngrad', 'sign', 'intsum']",
        ),
        (["--model", "resnet", "--depth", "50"], "depth 50 is not one of: 8, 14, 20, 32"),
        (["--density", "1.5"], "density=1.5 is out of range; allowed: (0.0, 1.0]"),
    ],
)
def test_bad_choice_gives_one_line_and_exit_2(
    venv_bin: Path, worker_env: dict[str, str], args: list[str], expected: str
) -> None:
    completed = _train(venv_bin, worker_env, *args)
    assert completed.returncode == 2
    assert _error_lines(completed.stderr) == [f"globaldl: error: {expected}"]


def test_impossible_batch_size_names_the_numbers(
    venv_bin: Path, worker_env: dict[str, str], tmp_path: Path
) -> None:
    summary = tmp_path / "s.json"
    completed = _train(venv_bin, worker_env, "--batch-size", "5000", "--summary", str(summary))
    assert completed.returncode == 2
    (line,) = _error_lines(completed.stderr)
    assert "5000" in line and "4000" in line
    assert not summary.exists()


def test_input_delay_on_a_rank_the_run_lacks_names_its_ranks(
    venv_bin: Path, worker_env: dict[str, str], tmp_path: Path
) -> None:
    summary = tmp_path / "s.json"
    completed = _train(
        venv_bin,
        worker_env,
        *("--input-delay-ms", "10", "--input-delay-rank", "1", "--summary", str(summary)),
    )
    assert completed.returncode == 2
    assert _error_lines(completed.stderr) == [
        "globaldl: error: input_delay_rank 1 is not allowed; the run's ranks are 0..0"
    ]
    assert not summary.exists()


def test_unwritable_summary_path_fails_before_training(
    venv_bin: Path, worker_env: dict[str, str], tmp_path: Path
) -> None:
    completed = _train(venv_bin, worker_env, "--summary", str(tmp_path / "no" / "such" / "s.json"))
    assert completed.returncode == 2
    (line,) = _error_lines(completed.stderr)
    assert "does not exist" in line and "no/such" in line
    assert list(tmp_path.iterdir()) == []


def test_unwritable_checkpoint_dir_fails_before_training(
    venv_bin: Path, worker_env: dict[str, str], tmp_path: Path
) -> None:
    completed = _train(
        venv_bin,
        worker_env,
        "--checkpoint-dir",
        "/proc/globaldl-ckpt",
        "--summary",
        str(tmp_path / "s.json"),
    )
    assert completed.returncode == 2
    (line,) = _error_lines(completed.stderr)
    assert "/proc/globaldl-ckpt is not writable" in line
    assert list(tmp_path.iterdir()) == []


def test_unknown_flag_is_refused_by_the_parser(venv_bin: Path, worker_env: dict[str, str]) -> None:
    completed = _train(venv_bin, worker_env, "--learning-rat", "0.1")
    assert completed.returncode == 2
    assert "--learning-rat" in completed.stderr


def test_bad_config_file_value_names_the_file(
    venv_bin: Path, worker_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("epochs: lots\n")
    completed = _train(venv_bin, worker_env, "--config", str(config))
    assert completed.returncode == 2
    (line,) = _error_lines(completed.stderr)
    assert "epochs = 'lots'" in line and str(config) in line


def test_every_command_has_help(venv_bin: Path, worker_env: dict[str, str]) -> None:
    listing = subprocess.run(
        [str(venv_bin / "globaldl"), "--help"],
        capture_output=True,
        text=True,
        env=worker_env,
        timeout=120,
        check=True,
    ).stdout
    assert "train" in listing
    completed = _train(venv_bin, worker_env, "--help")
    assert completed.returncode == 0 and "--prune" in completed.stdout
