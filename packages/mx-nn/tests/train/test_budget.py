"""The --seq/--batch memory bound: a lower bound of what a real step takes, so a run
that cannot fit is refused up front and no run that fits is."""

import json
import subprocess
import sys

import pytest

from mx_nn.train import parse_args
from mx_nn.train.args import ffn_width
from mx_nn.train.budget import step_bytes

# A step of the default model (bf16) at --batch 16: the peak RSS it adds to the process,
# measured after a small warm-up step so that one-time allocations are left out.
MEASURE = """
import json, resource, sys, torch
from mx_nn.train.args import parse_args
from mx_nn.train.loop import _train_step, build_model
seq = int(sys.argv[1])
args = parse_args(["--recipe", "bf16", "--seq", str(seq), "--device", "cpu",
                   "--out", sys.argv[2]])
model = build_model(args, "bf16", torch.device("cpu"))
opt = torch.optim.AdamW(model.parameters())
x = torch.randint(0, 256, (args.batch, 32))
_train_step(model, opt, x, x, True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
x = torch.randint(0, 256, (args.batch, seq))
_train_step(model, opt, x, x, True)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps((after - before) * 1024))
"""


def test_the_estimate_is_below_a_real_step_and_not_far_below(tmp_path):
    seq = 2048
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(seq), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.splitlines()[-1])
    estimate = step_bytes(dim=128, hidden=ffn_width(128), layers=2, tokens=16 * seq)
    assert estimate <= measured <= 3 * estimate, (estimate, measured)


def test_the_default_model_at_seq_100000_does_not_fit_24_gib():
    # A run found OOM-killed on a 24 GiB machine is refused there up front.
    assert step_bytes(dim=128, hidden=ffn_width(128), layers=2, tokens=16 * 100_000) > 24 * 2**30


def test_a_seq_beyond_memory_is_refused_naming_the_limit(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--seq", "10000000", "--device", "cpu"])
    assert e.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("mx-train: error: argument --seq: --batch 16 x --seq 10000000 "
                           "needs at least ")  # fmt: skip
    assert "GiB for one training step's activations" in last and "lower --seq or --batch" in last
