"""Real signals to a real ``mx-train`` process: SIGINT or SIGTERM in the middle of the
final save still leaves a complete checkpoint (exit 130), and kill -9 loses at most
``--save-every`` steps, the resumed run matching an uninterrupted one bit for bit.

A save is caught in the middle by watching for its folder: the test stops the process
(SIGSTOP) as soon as the folder appears and checks its manifest is not yet written, then
sends the signal and lets the process go on (SIGCONT)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mx_nn.train import checkpoint, main
from mx_nn.train.manifest import MANIFEST

MX_TRAIN = str(Path(sys.executable).with_name("mx-train"))
TIMEOUT = 600


def _curves(out: Path) -> dict:
    return json.loads((out / "loss_curves.json").read_text())["runs"]


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([MX_TRAIN, *argv], stdout=f, stderr=subprocess.STDOUT)


def _wait_for(proc: subprocess.Popen, found) -> Path | None:
    """Poll every millisecond until ``found()`` returns a path (then it is returned) or the
    process ends (None)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        path = found()
        if path is not None:
            return path
        time.sleep(0.001)
    return None


def _folder(root: Path, suffix: str):
    def find() -> Path | None:
        try:
            return next((Path(e.path) for e in os.scandir(root) if e.name.endswith(suffix)), None)
        except FileNotFoundError:
            return None

    return find


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_final_save_leaves_it_complete(sig, tiny, tmp_path, capsys):
    argv = [*tiny, "--recipe", "bf16", "--steps", "3", "--save-every", "0"]
    for attempt in range(3):  # a try that finds the save already done is not the case
        out = tmp_path / f"out{attempt}"
        proc = _start([*argv, "--out", str(out)], tmp_path / f"log{attempt}")
        gen = _wait_for(proc, _folder(out / "checkpoint", "-bf16-step000003"))
        assert gen is not None, (tmp_path / f"log{attempt}").read_text()
        os.kill(proc.pid, signal.SIGSTOP)
        mid_save = not (gen / MANIFEST).exists()
        os.kill(proc.pid, sig)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(TIMEOUT)
        if mid_save:
            break
    assert mid_save, "the save was never caught before its manifest"
    log = (tmp_path / f"log{attempt}").read_text()
    assert proc.returncode == 130, log
    assert f"mx-train: interrupted: bf16 finished; checkpoint in {gen}" in log, log
    assert "Traceback" not in log and "greedy sample" not in log
    assert checkpoint.find(out / "checkpoint") == gen  # complete and verified
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--resume"]) == 0  # the report, no training
    text = capsys.readouterr().out
    assert "greedy sample" in text and "bf16 step" not in text
    assert _curves(out)["bf16"]["steps"] == [1, 2, 3]


def test_kill_9_loses_at_most_save_every_steps(tiny, tmp_path):
    argv = [*tiny, "--recipe", "bf16", "--steps", "8", "--save-every", "2", "--seed", "2"]
    straight = subprocess.run([MX_TRAIN, *argv, "--out", str(tmp_path / "straight")],
                              capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert straight.returncode == 0, straight.stderr
    out = tmp_path / "killed"
    proc = _start([*argv, "--out", str(out)], tmp_path / "log")

    def saved_step_4_or_later() -> Path | None:
        newest = checkpoint.latest(out / "checkpoint")
        return newest if newest is not None and int(newest.name[-6:]) >= 4 else None

    assert _wait_for(proc, saved_step_4_or_later) is not None, (tmp_path / "log").read_text()
    proc.send_signal(signal.SIGKILL)
    proc.wait(TIMEOUT)
    newest = checkpoint.latest(out / "checkpoint")
    step = int(newest.name[-6:])
    assert proc.returncode == -signal.SIGKILL and 4 <= step < 8, (proc.returncode, newest)
    resumed = subprocess.run([MX_TRAIN, *argv, "--out", str(out), "--resume"],
                             capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {newest}" in resumed.stdout
    assert f"bf16 step {step + 1}/8" in resumed.stdout
    assert f"bf16 step {step}/8" not in resumed.stdout  # nothing ran twice
    assert _curves(out) == _curves(tmp_path / "straight")  # bit for bit
