"""Export from a distributed run: ``mx-train --tp 2`` / ``--dp 2 --export`` under torchrun
(gloo) exports its live sharded model from rank 0; ``python -m mx_nn.export`` exports the
run's DCP checkpoint one tensor at a time in one process; and an export of the same
weights in one process without any sharding: all three are the same bytes."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import mx_nn
from mx_nn.export import export
from mx_nn.export.__main__ import main as export_main
from mx_nn.models.llama import Llama
from mx_nn.train import checkpoint
from mx_nn.train.args import TrainArgs
from mx_nn.train.export import export_run
from mx_nn.train.loop import mx_filter

sys.path.insert(0, str(Path(__file__).parent))
from export_helpers import load_hf  # noqa: E402

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
MX_TRAIN = str(Path(sys.executable).with_name("mx-train"))
# Widths that stay whole MX blocks on each of two tensor-parallel ranks.
SHAPE = ["--layers", "1", "--dim", "64", "--heads", "2", "--kv-heads", "2", "--seq", "32",
         "--batch", "2", "--steps", "2", "--no-compare", "--device", "cpu"]  # fmt: skip


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _one_process_export(gen: Path, out: Path) -> None:
    """The checkpoint's weights in a plain one-process model, exported from memory."""
    args = TrainArgs(layers=1, dim=64, heads=2, kv_heads=2, seq=32)
    model = Llama(args.model_config)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(gen), no_dist=True)
    model.load_state_dict(state["model"])
    mx_nn.convert(model, "mxfp8", filter_fn=mx_filter)
    export(model, out, "mxfp8", compute_dtype=torch.bfloat16)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the one-process load
@pytest.mark.parametrize("layout", [["--tp", "2"], ["--dp", "2"]], ids=["tp2", "dp2"])
def test_two_rank_exports_equal_one_process(tmp_path, layout):
    run, live = tmp_path / "run", tmp_path / "live"
    proc = subprocess.run([*TORCHRUN, MX_TRAIN, *SHAPE, *layout, "--out", str(run),
                           "--export", str(live)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("exported the mxfp8 model as mxfp8") == 1  # rank 0 says it
    gen = checkpoint.latest(run / "checkpoint")
    assert sorted(p.name for p in gen.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    from_ckpt, _, scheme = export_run(run, tmp_path / "from_ckpt")
    assert scheme.name == "mxfp8"
    _one_process_export(gen, tmp_path / "one")
    assert _files(from_ckpt) == _files(live) == _files(tmp_path / "one")
    load_hf(live)  # and transformers loads it


def test_cli_exports_a_checkpoint_and_refuses_bad_input(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = ["--layers", "1", "--dim", "64", "--heads", "2", "--kv-heads", "1", "--seq", "32",
            "--batch", "2", "--steps", "2", "--device", "cpu"]  # fmt: skip
    assert mx_nn.train.main([*tiny, "--out", str(run), "--recipe", "mxfp4", "--no-compare",
                             "--export", str(tmp_path / "live")]) == 0  # fmt: skip
    assert export_main([str(run), str(tmp_path / "cli")]) == 0
    assert "exported the mxfp4 run as mxfp4 (mxfp4-pack-quantized)" in capsys.readouterr().out
    assert _files(tmp_path / "cli") == _files(tmp_path / "live")
    gen = checkpoint.latest(run / "checkpoint")
    assert export_main([str(gen), str(tmp_path / "gen")]) == 0  # a generation folder itself

    assert export_main([str(run), str(tmp_path / "cli")]) == 1  # not empty
    assert "is not empty" in capsys.readouterr().err
    assert export_main([str(run), str(tmp_path / "x"), "--scheme", "mxfp8"]) == 1
    assert "scheme='mxfp8' stores fp8_e4m3 weights, but" in capsys.readouterr().err
    assert export_main([str(tmp_path), str(tmp_path / "x")]) == 1
    assert "holds no complete mx-train checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    # A checkpoint of the bf16 baseline: no MX layer.
    base = tmp_path / "base"
    assert mx_nn.train.main([*tiny, "--out", str(base), "--recipe", "bf16"]) == 0
    assert export_main([str(base), str(tmp_path / "x")]) == 1
    assert "holds the bf16 baseline run: it has no MX layer" in capsys.readouterr().err

    # A corrupt checkpoint is refused, naming the file.
    shard = gen / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    assert export_main([str(run), str(tmp_path / "x")]) == 1
    assert f"{shard}: sha256" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("recipe", "target", "match"), [
    ("bf16", "new", "argument --export: needs an MX --recipe"),
    ("mxfp6", "new", "argument --export: recipe 'mxfp6': weights in fp6_e2m3 have no serving"),
    ("mxfp8", "file", "argument --export: out_dir .* is a file"),
])  # fmt: skip
def test_mx_train_export_flag_is_checked_before_training(tmp_path, capsys, recipe, target, match):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        mx_nn.train.parse_args(["--recipe", recipe, "--out", str(tmp_path / "run"),
                                "--export", str(tmp_path / target)])  # fmt: skip
    assert e.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
