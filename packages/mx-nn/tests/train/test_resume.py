import json
import signal

import pytest
import torch

from mx_nn.train import checkpoint, loop, main


def _curves(out):
    return json.loads((out / "loss_curves.json").read_text())["runs"]


def test_interrupted_and_crashed_runs_resume_bit_exactly(tmp_path, tiny, monkeypatch, capsys):
    argv = [*tiny, "--steps", "6", "--seed", "5"]
    assert main([*argv, "--out", str(tmp_path / "straight")]) == 0
    expected = _curves(tmp_path / "straight")
    assert list(expected) == ["bf16", "mxfp8"] and len(expected["mxfp8"]["steps"]) == 6

    real_step, calls = loop._train_step, {"n": 0}

    def faulty_step(model, optimizer, inputs, targets, autocast):
        calls["n"] += 1
        if calls["n"] == 3:  # Ctrl-C during bf16's step 3: it finishes, then the loop stops
            signal.raise_signal(signal.SIGINT)
        if calls["n"] == 3 + 3 + 2:  # then a crash inside mxfp8's step 2 (nothing applied)
            raise RuntimeError("simulated crash")
        return real_step(model, optimizer, inputs, targets, autocast)

    monkeypatch.setattr(loop, "_train_step", faulty_step)
    out = tmp_path / "interrupted"
    assert main([*argv, "--out", str(out)]) == 130
    assert "bf16 stopped after step 3" in capsys.readouterr().out
    assert (checkpoint.latest(out / "checkpoint") / ".metadata").is_file()
    with pytest.raises(RuntimeError, match="simulated crash"):
        main([*argv, "--out", str(out), "--resume"])
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert calls["n"] == 3 + 3 + 2 + 5  # no step ran twice but the crashed one
    assert _curves(out) == expected  # every train and held-out loss, bit for bit

    # The finished checkpoint resumes to the same report without training.
    calls["n"] = 100
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert calls["n"] == 100 and _curves(out) == expected


def test_resume_with_other_flags_is_refused(tmp_path, tiny, capsys):
    argv = [*tiny, "--steps", "2", "--no-compare", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert main([*argv, "--resume", "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "argument --resume: the checkpoint was made with --lr 0.003 (now 0.01)" in err


def test_checkpoint_roundtrip_restores_rng_and_optimizer(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    checkpoint.save(
        tmp_path / "ck", model, opt, {"step": 1, "rng": checkpoint.rng_state()}, tag="step1"
    )
    expected = torch.rand(3)
    model2 = torch.nn.Linear(4, 4)
    opt2 = torch.optim.AdamW(model2.parameters())
    state = checkpoint.load(checkpoint.find(tmp_path / "ck"), model2, opt2)
    checkpoint.set_rng_state(state["rng"])
    assert torch.equal(torch.rand(3), expected) and state["step"] == 1
    assert torch.equal(model2.weight, model.weight)
    assert torch.equal(
        opt2.state[model2.weight]["exp_avg_sq"], opt.state[model.weight]["exp_avg_sq"]
    )
