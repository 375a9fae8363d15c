import pytest
import torch

from mx_nn.train.distributed import agree_step, dp_shard, sum_over_dp


class _Dim:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.n = rank, size

    def get_local_rank(self) -> int:
        return self.rank

    def size(self) -> int:
        return self.n


class _Mesh:
    """What dp_shard reads of a ("dp", "tp") DeviceMesh: the dp rank and degree."""

    def __init__(self, rank: int, size: int) -> None:
        self.dp = _Dim(rank, size)

    def __getitem__(self, name: str) -> _Dim:
        assert name == "dp"
        return self.dp


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8])
def test_dp_shard_covers_the_batch_once_in_order(rows, size):
    shards = [dp_shard(rows, _Mesh(r, size)) for r in range(size)]
    per = -(-rows // size)
    assert all(len(idx) == len(w) == per for idx, w in shards)  # one shape on every rank
    idx = torch.cat([i for i, _ in shards])
    weight = torch.cat([w for _, w in shards])
    assert torch.equal(idx[weight == 1], torch.arange(rows))  # each row once, in order
    assert set(weight.tolist()) <= {0.0, 1.0} and int(weight.sum()) == rows
    assert idx.max() == rows - 1  # padding repeats a real row


def test_one_process_needs_no_collective():
    assert torch.equal(dp_shard(3, None)[0], torch.arange(3))
    assert sum_over_dp([1.5, 2.0], None) == [1.5, 2.0]
    assert agree_step(0.25, True, None) == (0.25, True)
