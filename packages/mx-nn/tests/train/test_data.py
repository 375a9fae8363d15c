import pytest
import torch

from mx_nn.train.data import MAX_HELDOUT_BATCHES, ByteData, load_text


def test_builtin_corpus_ships_with_its_notice():
    text, name = load_text(None)
    assert 250_000 < len(text) < 400_000 and "Shakespeare" in name
    assert text.startswith(b"MACBETH") and b"Gutenberg" not in text
    from importlib import resources

    notice = (resources.files("mx_nn.train") / "corpus" / "NOTICE.md").read_text()
    assert "public domain" in notice and "shakespeare" in notice


def test_split_and_batches():
    text = bytes(range(256)) * 40  # 10,240 bytes
    data = ByteData(text, seq=16)
    assert len(data.heldout) == 1024 and len(data.train) == 10_240 - 1024
    torch.testing.assert_close(data.heldout, torch.tensor(list(text[-1024:]), dtype=torch.uint8))
    x, y = data.train_batch(7, 4, seed=1)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    torch.testing.assert_close(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    # Batches depend on (seed, step) alone.
    assert torch.equal(data.train_batch(7, 4, seed=1)[0], x)
    assert not torch.equal(data.train_batch(8, 4, seed=1)[0], x)
    assert not torch.equal(data.train_batch(7, 4, seed=2)[0], x)
    held = data.heldout_batches(4)
    assert len(held) == MAX_HELDOUT_BATCHES and all(b[0].shape == (4, 16) for b in held)
    assert held[-1][1][-1, -1].item() == text[-1]  # the last window ends the text


def test_too_short_or_not_utf8(tmp_path):
    with pytest.raises(ValueError, match="--data has 40 bytes; --seq 32 needs at least 66"):
        ByteData(b"x" * 40, seq=32)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8"):
        load_text(bad)
