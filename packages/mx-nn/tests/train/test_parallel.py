"""``mx-train --tp 2`` under torchrun follows the ``--tp 1`` curve (CPU, gloo).

In fp32 (``--no-autocast``): under bf16 autocast, tensor parallelism's other order of
the partial sums moves the logits of plain (non-MX) TP by about 3e-3 relative already,
which says nothing about the parallelism; fp32 isolates it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import mx_nn

# Head and kv widths that stay multiples of the MX block of 32 on each of two ranks.
SHAPE = ["--layers", "1", "--dim", "128", "--heads", "4", "--kv-heads", "2", "--seq", "64",
         "--batch", "4", "--steps", "20", "--no-compare", "--device", "cpu",
         "--no-autocast"]  # fmt: skip


def _heldout(out: Path) -> list[float]:
    return json.loads((out / "loss_curves.json").read_text())["runs"]["mxfp8"]["heldout_loss"]


@pytest.mark.skipif(getattr(mx_nn, "parallelize", None) is None, reason="needs mx_nn.parallelize")
def test_tp2_follows_tp1_within_1e_3(tmp_path):
    script = str(Path(sys.executable).with_name("mx-train"))
    one = tmp_path / "tp1"
    subprocess.run([script, *SHAPE, "--out", str(one)], check=True, capture_output=True,
                   timeout=600)  # fmt: skip
    two = tmp_path / "tp2"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]  # fmt: skip
    proc = subprocess.run([*torchrun, script, *SHAPE, "--tp", "2", "--out", str(two)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = _heldout(one), _heldout(two)
    assert len(a) == len(b) == 10
    for x, y in zip(a, b, strict=True):
        assert abs(x - y) <= 1e-3 * abs(x), (a, b)
