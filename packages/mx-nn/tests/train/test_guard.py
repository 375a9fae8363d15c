"""The non-finite guard: a run whose loss or gradient goes NaN stops at that step with
exit status 3, names the first module whose output went non-finite, and leaves only
checkpoints from before it."""

import math

import pytest
import torch

from mx_nn.models.llama import Llama, LlamaConfig
from mx_nn.train import checkpoint, main, parse_args
from mx_nn.train.guard import all_finite, first_nonfinite_module
from mx_nn.train.loop import build_model


def test_a_nan_loss_stops_the_run_before_any_checkpoint_holds_it(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    # lr 1e20: step 1's update makes the weights ~1e20, step 2's forward overflows. With
    # 20 steps the held-out loss is measured every 2 steps: not after step 1.
    argv = [*tiny, "--recipe", "bf16", "--steps", "20", "--save-every", "1", "--lr", "1e20",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "mx-train: error: bf16 step 2: loss nan, gradient norm nan; the first module whose " \
        "forward output is not finite: layers.0." in err, err  # fmt: skip
    assert "The step was not applied; the newest checkpoint, " in err and "Traceback" not in err
    gens = checkpoint.generations(out / "checkpoint")
    assert [g.name for g in gens] == ["000001-bf16-step000001"]
    assert not (out / "summary.json").exists()
    # What that checkpoint holds is finite, optimizer state included.
    args = parse_args(argv[:-2] + ["--out", str(tmp_path / "other")])
    model = build_model(args, "bf16", torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters())
    state = checkpoint.load(checkpoint.find(out / "checkpoint"), model, opt)
    assert state["step"] == 1 and all_finite(model)
    assert all(torch.isfinite(t).all() for s in opt.state.values() for t in s.values())
    assert all(math.isfinite(x) for x in state["interval"]) and state["interval"]


def test_a_nan_held_out_loss_stops_the_run_too(tiny, tmp_path, capsys):
    out = tmp_path / "out"  # 4 steps: held-out loss after each, NaN after step 1's update
    argv = [*tiny, "--recipe", "bf16", "--steps", "4", "--save-every", "1", "--lr", "1e20"]
    assert main([*argv, "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert "mx-train: error: bf16 step 1: held-out loss nan; the first module whose forward " \
        "output is not finite: layers.0." in err, err  # fmt: skip
    assert "The step was applied but not saved; no checkpoint was written" in err
    assert checkpoint.latest(out / "checkpoint") is None


def _llama() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(dim=64, n_layers=2, n_heads=2, n_kv_heads=1, hidden_dim=128,
                             max_seq_len=16))  # fmt: skip


@pytest.mark.parametrize("autocast", [False, True])
def test_first_nonfinite_module_is_the_first_in_forward_order(autocast):
    model = _llama()
    tokens = torch.randint(0, 256, (2, 16))
    assert first_nonfinite_module(model, tokens, autocast) is None
    with torch.no_grad():
        model.layers[1].feed_forward.w2.weight[0, 0] = math.inf
    assert first_nonfinite_module(model, tokens, autocast) == "layers.1.feed_forward.w2"
    with torch.no_grad():
        model.layers[0].attention.wv.weight[3, 1] = math.nan
    assert first_nonfinite_module(model, tokens, autocast) == "layers.0.attention.wv"
    assert not model._forward_hooks and not model.layers[0].attention.wv._forward_hooks
