"""``mx-train --tp 2`` and ``--dp 2`` under torchrun follow the one-process curves
(CPU, gloo), and ``--dp 2`` resumes from an interrupt on one rank bit for bit.

In fp32 (``--no-autocast``): under bf16 autocast, tensor parallelism's other order of
the partial sums moves the logits of plain (non-MX) TP by about 3e-3 relative already,
which says nothing about the parallelism; fp32 isolates it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import mx_nn
from mx_nn.train import checkpoint, main
from mx_nn.train.data import ByteData, load_text

# Head and kv widths that stay multiples of the MX block of 32 on each of two ranks.
SHAPE = ["--layers", "1", "--dim", "128", "--heads", "4", "--kv-heads", "2", "--seq", "64",
         "--batch", "4", "--steps", "20", "--no-compare", "--device", "cpu",
         "--no-autocast"]  # fmt: skip


RTOL = 1e-3
"""Relative distance of a parallel run's held-out loss from one process's. fp32 sums in
another order move the weights by ~1e-7; MX casts of them can round a few elements the
other way, which the curves amplify step by step (~1e-7 after 10 steps at TINY below,
~4e-4 after 20 at SHAPE)."""
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
MX_TRAIN = str(Path(sys.executable).with_name("mx-train"))
needs_parallelize = pytest.mark.skipif(
    getattr(mx_nn, "parallelize", None) is None, reason="needs mx_nn.parallelize"
)


def _curves(out: Path) -> dict:
    return json.loads((out / "loss_curves.json").read_text())["runs"]


def _heldout(out: Path) -> list[float]:
    return _curves(out)["mxfp8"]["heldout_loss"]


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= RTOL * abs(x) for x, y in zip(a, b, strict=True))


@needs_parallelize
def test_tp2_follows_tp1_within_1e_3(tmp_path):
    one = tmp_path / "tp1"
    subprocess.run([MX_TRAIN, *SHAPE, "--out", str(one)], check=True, capture_output=True,
                   timeout=600)  # fmt: skip
    two = tmp_path / "tp2"
    proc = subprocess.run([*TORCHRUN, "--nproc-per-node", "2", MX_TRAIN, *SHAPE, "--tp", "2",
                           "--out", str(two)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = _heldout(one), _heldout(two)
    assert len(a) == 10 and _close(a, b), (a, b)


# --batch is global: the two dp ranks take rows 0-1 and 2-3 of the one process's batch of
# 4, and FSDP2 averages their gradients, so both train on the same batches.
TINY = ["--layers", "1", "--dim", "64", "--heads", "2", "--kv-heads", "1", "--seq", "32",
        "--batch", "4", "--steps", "10", "--compare", "--device", "cpu", "--no-autocast",
        "--seed", "3"]  # fmt: skip
INTERRUPT = Path(__file__).with_name("interrupt_rank.py")


def _torchrun(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHRUN, "--nproc-per-node", "2", *argv], capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@needs_parallelize
def test_dp2_follows_one_process_and_resumes_bit_exactly(tmp_path):
    # 3,000 bytes: 300 held out, 9 windows of 33 in batches of 4, 4 and 1, so the last
    # held-out batch leaves rank 1 only padding (weight 0) to evaluate.
    text = tmp_path / "text.txt"
    text.write_bytes(load_text(None)[0][:3000])
    argv = [*TINY, "--data", str(text)]
    assert [len(x) for x, _ in ByteData(text.read_bytes(), seq=32).heldout_batches(4)] == [4, 4, 1]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    one = _curves(tmp_path / "one")

    straight = tmp_path / "dp2"
    proc = _torchrun(MX_TRAIN, *argv, "--dp", "2", "--out", str(straight))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dp = _curves(straight)
    for recipe in ("bf16", "mxfp8"):
        a, b = one[recipe]["heldout_loss"], dp[recipe]["heldout_loss"]
        assert len(a) == 10 and _close(a, b), (recipe, a, b)
        a, b = one[recipe]["train_loss"], dp[recipe]["train_loss"]
        assert _close(a, b), (recipe, a, b)  # the global batch's loss, not rank 0's half
    # Only rank 0 reports; every rank logs to a file of its own.
    assert proc.stdout.count("greedy sample") == 1 and proc.stdout.count("mxfp8 step 10/10") == 1
    assert (straight / "train.log").is_file() and (straight / "train-rank1.log").is_file()

    # SIGTERM on rank 1 alone, during mxfp8's step 3: both ranks stop after that step.
    out = tmp_path / "interrupted"
    proc = _torchrun(str(INTERRUPT), "1", "13", *argv, "--dp", "2", "--out", str(out))
    assert proc.returncode != 0 and "mxfp8 stopped after step 3" in proc.stdout, proc.stdout
    assert sorted(p.name for p in checkpoint.latest(out / "checkpoint").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]  # fmt: skip
    proc = _torchrun(MX_TRAIN, *argv, "--dp", "2", "--out", str(out), "--resume")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mxfp8 step 4/10" in proc.stdout and "bf16 step" not in proc.stdout
    assert _curves(out) == dp  # every train and held-out loss, bit for bit

    # One changed byte in rank 1's shard: the ranks share the check out, and both refuse.
    shard = checkpoint.latest(out / "checkpoint") / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    proc = _torchrun(MX_TRAIN, *argv, "--dp", "2", "--out", str(out), "--resume")
    assert proc.returncode != 0 and f"{shard}: sha256" in proc.stderr, proc.stderr[-3000:]
    assert "is corrupt, so it is not resumed from" in proc.stderr
