import pytest

import mx_nn
from mx_nn.train import TrainArgs, main, parse_args


def test_no_arguments_is_the_default_run():
    args = parse_args([])
    expected = TrainArgs(device=args.device)
    assert args == expected
    assert args.runs == ("bf16", "mxfp8")
    assert parse_args(["--recipe", "bf16"]).runs == ("bf16",)
    assert parse_args(["--no-compare"]).runs == ("mxfp8",)
    assert parse_args(["--recipe", "mxfp4"]).runs == ("bf16", "mxfp4")
    cfg = parse_args(["--dim", "64", "--heads", "2", "--kv-heads", "1", "--seq", "32"]).model_config
    assert (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, cfg.max_seq_len) == (
        64, 2, 1, 256, 32,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--steps", "0"], "--steps"),
        (["--batch", "two"], "--batch"),
        (["--recipe", "fp9"], "--recipe"),
        (["--lr", "-1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--seed", "-3"], "--seed"),
        (["--heads", "3"], "--heads"),
        (["--kv-heads", "3"], "--kv-heads"),
        (["--dim", "48", "--heads", "2", "--kv-heads", "1"], "--dim"),
        (["--compare", "--recipe", "bf16"], "--compare"),
        (["--dp", "3"], "--dp"),
        (["--tp", "3"], "--tp"),
        (["--device", "tpu"], "--device"),
        (["--device", "nonsense"], "--device"),
        (["--data", "/nonexistent/file.txt"], "--data"),
        (["--save-every", "-1"], "--save-every"),
        (["--save-every", "2.5"], "--save-every"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mx-train") and flag in err.splitlines()[-1], err


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--resume", "--out", str(tmp_path)])
    assert f"argument --resume: no checkpoint in --out {str(tmp_path)!r}" in capsys.readouterr().err


def test_parallel_flags_need_parallelize_and_torchrun(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["--tp", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    if getattr(mx_nn, "parallelize", None) is None:
        assert "tensor/data parallel training needs mx_nn.parallelize" in err
    else:
        assert "needs 2 processes, WORLD_SIZE is 1: run under torchrun" in err
