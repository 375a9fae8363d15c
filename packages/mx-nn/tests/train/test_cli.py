import json
import math
import re
import subprocess
import sys
from pathlib import Path

from mx_nn.train import main

POEM = (
    "Ô Rose, thou art sick!\nThe invisible worm\nThat flies in the night,\nIn the howling storm,\n"
)


def test_console_script_on_a_small_file(tmp_path, tiny):
    data = tmp_path / "poem.txt"
    data.write_text(POEM * 30, encoding="utf-8")  # 2.6 KB, some bytes not ASCII
    script = Path(sys.executable).with_name("mx-train")
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(script), *tiny, "--steps", "4", "--data", str(data), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"data: {data}" in text
    # In a pipe: plain lines, no bar redrawn with carriage returns.
    assert "\r" not in text + proc.stderr
    assert re.search(r"^bf16 step 4/4 loss [\d.]+ held-out [\d.]+ tok/s", text, re.M)
    assert re.search(r"^mxfp8 step 4/4 loss", text, re.M)
    assert "greedy sample (mxfp8" in text

    # The figures exist and the JSON holds what the table shows.
    for png in ("loss_curves.png", "sqnr.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    curves = json.loads((out / "loss_curves.json").read_text())["runs"]
    sqnr = json.loads((out / "sqnr.json").read_text())["sqnr_db"]
    assert summary["sqnr_db"] == sqnr
    for row in summary["runs"]:
        line = re.search(rf"^{row['recipe']} +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) MiB$", text, re.M)
        assert line, text
        train, held, gap, tps, mem = line.groups()
        assert train == f"{row['train_loss']:.4f}" and held == f"{row['heldout_loss']:.4f}"
        assert row["heldout_loss"] == curves[row["recipe"]]["heldout_loss"][-1]
        assert row["train_loss"] == curves[row["recipe"]]["train_loss"][-1]
        assert tps == f"{row['tokens_per_s']:,.0f}" and mem == f"{row['peak_memory_mib']:,.0f}"
        if row["recipe"] == "bf16":
            assert gap == "-" and row["gap_vs_bf16_pct"] is None
        else:
            assert gap == f"{row['gap_vs_bf16_pct']:+.2f}%"
    assert list(sqnr)[:2] == ["layers.0.attention.wq", "layers.0.attention.wk"]
    assert list(sqnr)[-1] == "output" and len(sqnr) == 7 + 1 + 1
    block = re.search(r"^  layers\.0 +wq (\S+)  wk (\S+) .* block (\S+)$", text, re.M)
    assert block and block.group(1) == f"{sqnr['layers.0.attention.wq']:.1f}"
    assert block.group(3) == f"{sqnr['layers.0']:.1f}"
    assert all(v is None or 15 < v < 80 for v in sqnr.values())  # MXFP8: about 30-40 dB


def test_default_shape_mxfp8_within_2_percent_of_bf16(tmp_path, capsys):
    """The no-argument run's model, batch and recipe (mxfp8 against bf16, --compare on by
    default), shortened from 300 to 100 steps for CI. Not fewer: at 40 steps both runs are
    still in the steep part of the curve, where a few steps' lag is a 2% gap: on a CPU
    without AVX512-BF16 (other bf16 matmul kernels than where this test was written) seeds
    0, 1 and 2 read +2.58%, -0.01% and +0.45% there, and seeds 0 and 1 read -0.09% and
    +0.28% at 100 steps."""
    assert main(["--steps", "100", "--device", "cpu", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "summary.json").read_text())["runs"]
    bf16, mx = rows
    assert (bf16["recipe"], mx["recipe"]) == ("bf16", "mxfp8")
    assert mx["heldout_loss"] < 0.6 * math.log(256)  # it learned: uniform bytes give ln 256
    assert abs(mx["gap_vs_bf16_pct"]) < 2.0, rows
