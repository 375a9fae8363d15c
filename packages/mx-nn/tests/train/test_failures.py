"""``mx-train`` when things go wrong: a crash or a full disk in a periodic save, a
corrupt checkpoint, an --out that holds a run or cannot be written, a moved run, bad
--data. Runs are bf16 only (no MX casts): a few seconds each."""

import errno
import json
import os
import shutil
import signal

import pytest

from mx_nn.train import checkpoint, loop, main
from mx_nn.train.data import load_text
from mx_nn.train.manifest import MANIFEST


def _curves(out):
    return json.loads((out / "loss_curves.json").read_text())["runs"]


ARGV = ["--layers", "1", "--dim", "64", "--heads", "2", "--kv-heads", "1", "--seq", "32",
        "--batch", "4", "--device", "cpu", "--recipe", "bf16", "--steps", "6",
        "--save-every", "2", "--seed", "5"]  # fmt: skip


@pytest.fixture
def argv():
    return list(ARGV)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The curves of the uninterrupted run, once per module (and worker)."""
    out = tmp_path_factory.mktemp("straight")
    assert main([*ARGV, "--out", str(out)]) == 0
    return _curves(out)


def _fail_in_save(monkeypatch, faults, call: int, **arm) -> None:
    """Arm ``faults`` when the ``call``-th checkpoint save of the process begins."""
    real, calls = checkpoint.save, [0]

    def save(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            faults.arm(**arm)
        try:
            return real(*args, **kwargs)
        finally:
            faults.disarm()

    monkeypatch.setattr(checkpoint, "save", save)


@pytest.mark.parametrize("op", ["replace", "rmtree"])  # before and after the switch
def test_crash_in_a_periodic_save_resumes_bit_exactly(op, argv, straight, tmp_path,
                                                      monkeypatch, faults, capsys):  # fmt: skip
    out = tmp_path / "out"
    _fail_in_save(monkeypatch, faults, 2, at=1, op=op)  # the save after step 4
    with pytest.raises(faults.Crash):
        main([*argv, "--out", str(out)])
    newest = checkpoint.latest(out / "checkpoint")
    assert newest.name.endswith("bf16-step00000" + ("2" if op == "replace" else "4"))
    monkeypatch.undo()
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert f"resuming {newest}" in capsys.readouterr().out
    assert _curves(out) == straight  # every train and held-out loss, bit for bit


def test_disk_full_in_a_save_stops_with_a_message(argv, straight, tmp_path, monkeypatch,
                                                  faults, capsys):  # fmt: skip
    out = tmp_path / "out"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    _fail_in_save(monkeypatch, faults, 2, at=1, op="write", error=full)
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    kept = checkpoint.latest(out / "checkpoint")
    assert "mx-train: error: cannot write the checkpoint" in err and "Traceback" not in err
    assert "No space left on device" in err and f"{kept}, is unchanged" in err, err
    monkeypatch.undo()
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert _curves(out) == straight


def test_a_corrupt_checkpoint_is_refused_naming_the_file(argv, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 0
    payload = checkpoint.latest(out / "checkpoint") / "__0_0.distcp"
    data = bytearray(payload.read_bytes())
    for i in range(4):  # four bytes inside the tensors' bytes, as a disk error would
        data[len(data) // 2 + i] ^= 0xFF
    payload.write_bytes(data)
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--resume"]) == 1
    err = capsys.readouterr().err
    assert f"{payload}: sha256" in err and "is corrupt, so it is not resumed from" in err, err
    assert "Traceback" not in err


def test_a_fresh_run_over_a_checkpoint_is_refused(argv, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 0
    kept = checkpoint.latest(out / "checkpoint")
    before = {p.name: p.read_bytes() for p in kept.iterdir()}
    with pytest.raises(SystemExit) as e:
        main([*argv, "--seed", "6", "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument --out: {str(out)!r} holds the checkpoint" in err
    assert "--resume" in err and "--overwrite" in err
    assert checkpoint.latest(out / "checkpoint") == kept
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(out), "--resume", "--overwrite"])
    assert "argument --overwrite: not with --resume" in capsys.readouterr().err
    assert main([*argv, "--seed", "6", "--out", str(out), "--overwrite"]) == 0
    assert [g.name for g in checkpoint.generations(out / "checkpoint")] == [
        f"{int(kept.name[:6]) + 3:06d}-bf16-step000006"
    ]  # 3 saves: steps 2, 4 and 6


def test_a_moved_run_resumes_and_edited_data_is_refused(argv, tmp_path, monkeypatch, capsys):
    text = tmp_path / "first" / "text.txt"
    text.parent.mkdir()
    corpus = load_text(None)[0][:6000]
    text.write_bytes(corpus)
    real_step, calls = loop._train_step, [0]

    def interrupted(*args):
        calls[0] += 1
        if calls[0] == 3:
            signal.raise_signal(signal.SIGINT)
        return real_step(*args)

    monkeypatch.setattr(loop, "_train_step", interrupted)
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--data", "first/text.txt", "--out", "run"]) == 130
    monkeypatch.undo()
    assert main([*argv, "--data", str(text), "--out", str(tmp_path / "whole")]) == 0
    # Moved, run folder and text both, and named relatively with a trailing slash.
    shutil.move(tmp_path / "run", tmp_path / "moved")
    shutil.move(text, tmp_path / "text.txt")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "edited.txt").write_bytes(corpus[:-1] + b"!")
    assert main([*argv, "--data", "edited.txt", "--out", "moved/", "--resume"]) == 2
    assert "argument --data: the checkpoint was trained on first/text.txt" in \
        capsys.readouterr().err  # fmt: skip
    assert main([*argv, "--data", "./text.txt", "--out", "moved/", "--resume"]) == 0
    assert _curves(tmp_path / "moved") == _curves(tmp_path / "whole")


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_out_that_is_no_folder_is_refused(where, tiny, tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    out = blocker if where == "file" else blocker / "out"
    with pytest.raises(SystemExit) as e:
        main([*tiny, "--recipe", "bf16", "--steps", "1", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mx-train") and "argument --out" in err.splitlines()[-1], err


def test_an_unwritable_out_is_refused(tiny, tmp_path, faults, capsys):
    # Root ignores permission bits, so the refusal a read-only --out gives comes from a
    # failing mkdir; the message is what counts.
    faults.arm(at=1, op="mkdir", error=OSError(errno.EROFS, os.strerror(errno.EROFS)))
    assert main([*tiny, "--recipe", "bf16", "--steps", "1", "--out", str(tmp_path / "o")]) == 2
    faults.disarm()
    err = capsys.readouterr().err
    assert "mx-train: error: argument --out: cannot write in" in err
    assert "Read-only file system" in err


def test_empty_data_is_refused(tiny, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        main([*tiny, "--data", str(empty), "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert f"argument --data: {str(empty)!r} is empty" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_resume_of_an_incomplete_checkpoint_says_so(tiny, tmp_path, capsys):
    partial = tmp_path / "checkpoint" / "000001-bf16-step000002"
    partial.mkdir(parents=True)
    (partial / "__0_0.distcp").write_bytes(b"cut short")
    assert not (partial / MANIFEST).exists()
    with pytest.raises(SystemExit):
        main([*tiny, "--out", str(tmp_path), "--resume"])
    err = capsys.readouterr().err
    assert f"argument --resume: no checkpoint in --out {str(tmp_path)!r} (only incomplete" in err
