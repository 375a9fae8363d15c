"""``checkpoint.save`` under a crash or a full disk at every file operation, and
``checkpoint.find`` against every changed byte: every crash point leaves a complete
checkpoint, old or new, that loads bit for bit; no corruption is resumed from."""

import errno
import re
import shutil

import pytest
import torch

from mx_nn.train import checkpoint, manifest
from mx_nn.train.manifest import CheckpointError


def _trained(steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(3, 8)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _snapshot(model, opt) -> list[torch.Tensor]:
    state = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        state += [opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()]
    return state


def _save(root, steps):
    model, opt = _trained(steps)
    loop = {"step": steps, "rng": checkpoint.rng_state(), "losses": [0.5] * steps}
    return checkpoint.save(root, model, opt, loop, tag=f"step{steps:06d}"), _snapshot(model, opt)


def _loaded(root) -> tuple[int, list[torch.Tensor]]:
    model, opt = _trained(0)
    state = checkpoint.load(checkpoint.find(root), model, opt)
    return state["step"], _snapshot(model, opt)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture
def old(tmp_path):
    """A folder holding one complete checkpoint (step 1) and the state it holds."""
    root = tmp_path / "template"
    _, state1 = _save(root, 1)
    return root, state1, _snapshot(*_trained(2))  # and the state a save of step 2 holds


def test_crash_at_every_file_operation_leaves_old_or_new(tmp_path, old, faults):
    template, state1, state2 = old
    shutil.copytree(template, tmp_path / "count")
    faults.arm()
    _save(tmp_path / "count", 2)
    ops = faults.disarm()
    names = {name for name, _ in ops}
    assert {"mkdir", "open", "write", "fsync", "replace", "rmtree", "unlink"} <= names, names
    outcomes = []
    for k in range(1, len(ops) + 2):  # a crash before each operation, and none at all
        root = tmp_path / f"k{k}"
        shutil.copytree(template, root)
        faults.arm(at=k)
        try:
            _save(root, 2)
        except (faults.Crash, CheckpointError):  # raised inside torch.save's C++ writer,
            pass  # the crash comes back as a RuntimeError, so the save fails: it stops there
        finally:
            faults.disarm()
        step, state = _loaded(root)
        assert _same(state, state1 if step == 1 else state2), (k, ops[k - 1 : k])
        outcomes.append(step)
        # The next save clears whatever the crash left and keeps only itself.
        _save(root, 3)
        assert [g.name for g in checkpoint.generations(root)] == [
            checkpoint.latest(root).name] and len(list(root.iterdir())) == 1  # fmt: skip
        assert _loaded(root)[0] == 3
    # Until the manifest is renamed into place the old one is found, after it the new.
    switch = next(i for i, (name, what) in enumerate(ops) if name == "replace"
                  and what.endswith(manifest.MANIFEST + ".tmp"))  # fmt: skip
    assert outcomes == [1] * (switch + 1) + [2] * (len(ops) - switch), outcomes


def test_disk_full_at_any_write_keeps_the_old_checkpoint(tmp_path, old, faults):
    template, state1, _ = old
    shutil.copytree(template, tmp_path / "count")
    faults.arm(op="write")
    _save(tmp_path / "count", 2)
    writes = len(faults.disarm())
    assert writes >= 4
    for k in range(1, writes + 1):
        root = tmp_path / f"k{k}"
        shutil.copytree(template, root)
        faults.arm(at=k, op="write", error=OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(CheckpointError) as e:
            _save(root, 2)
        faults.disarm()
        assert "No space left on device" in str(e.value)
        assert f"the newest complete checkpoint, {checkpoint.latest(root)}, is unchanged" in \
            str(e.value)  # fmt: skip
        step, state = _loaded(root)
        assert step == 1 and _same(state, state1)


def test_a_changed_byte_in_any_file_is_refused(tmp_path):
    root = tmp_path / "ck"
    gen, _ = _save(root, 1)
    files = sorted(p.name for p in gen.iterdir())
    assert files == [".metadata", "__0_0.distcp", "loop-rank0.pt", manifest.MANIFEST]
    checkpoint.find(root)  # intact: verifies
    for name in files:
        path = gen / name
        original = path.read_bytes()
        # Every byte of the manifest (its seal has structure); about 200 evenly spread
        # over each other file, first and last included (a SHA-256 misses none).
        stride = 1 if name == manifest.MANIFEST else max(1, len(original) // 200)
        for i in [*range(0, len(original), stride), len(original) - 1]:
            changed = bytearray(original)
            changed[i] ^= 0x01  # one bit: the least a disk or a copy can get wrong
            path.write_bytes(changed)
            with pytest.raises(CheckpointError, match=re.escape(str(path))):
                checkpoint.find(root)
        path.write_bytes(original)
    checkpoint.find(root)


def test_missing_and_truncated_files_are_refused(tmp_path):
    gen, _ = _save(tmp_path / "ck", 1)
    (gen / "__0_0.distcp").write_bytes((gen / "__0_0.distcp").read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="__0_0.distcp: .* bytes, the manifest says"):
        checkpoint.find(tmp_path / "ck")
    (gen / "__0_0.distcp").unlink()  # a half-deleted checkpoint
    with pytest.raises(CheckpointError, match="__0_0.distcp: listed in the manifest but"):
        checkpoint.find(tmp_path / "ck")


def test_incomplete_generations_are_ignored_and_a_corrupt_newest_is_not_skipped(tmp_path):
    root = tmp_path / "ck"
    with pytest.raises(CheckpointError, match="no complete checkpoint in"):
        checkpoint.find(root)
    gen1, _ = _save(root, 1)
    partial = root / "000007-step000002"  # a save cut short: no manifest
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    assert checkpoint.find(root) == gen1
    gen2, _ = _save(root, 2)
    assert gen2.name == "000008-step000002" and checkpoint.generations(root) == [gen2]
    # An older complete one beside a corrupt newest: refused, never fallen back to.
    shutil.copytree(gen2, root / "000001-step000001")
    (gen2 / "loop-rank0.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="is corrupt, so it is not resumed from"):
        checkpoint.find(root)
