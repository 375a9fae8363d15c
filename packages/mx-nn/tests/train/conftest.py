import pytest

# A model small enough that a run of a few steps takes about a second on one CPU core.
TINY = ["--layers", "1", "--dim", "64", "--heads", "2", "--kv-heads", "1", "--seq", "32",
        "--batch", "4", "--device", "cpu"]  # fmt: skip


@pytest.fixture
def tiny() -> list[str]:
    return list(TINY)
