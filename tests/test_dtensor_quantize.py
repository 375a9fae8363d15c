"""mx_core.quantize on DTensors keeps every placement and communicates nothing."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mx_core

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _same_shard(dt, whole: torch.Tensor, shard_dim: int, rank: int) -> bool:
    # gloo cannot gather float8: compare this rank's shard with the reference's.
    mine = whole.view(torch.uint8).chunk(WORLD, dim=shard_dim)[rank]
    return torch.equal(dt.to_local().view(torch.uint8), mine)


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.tensor.debug import CommDebugMode

        mesh = init_device_mesh("cpu", (WORLD,))
        torch.manual_seed(0)
        full = torch.randn(4, 6, 128, dtype=torch.bfloat16)
        out = []
        # (placement dim, blocked dim): sharded on a non-block dim, and on the block
        # dim itself with whole blocks per shard.
        for shard_dim, block_dim in [(0, 2), (1, 2), (2, 2), (2, 0)]:
            if block_dim == 0:
                x = distribute_tensor(full.transpose(0, 2).contiguous(), mesh, [Shard(shard_dim)])
            else:
                x = distribute_tensor(full, mesh, [Shard(shard_dim)])
            with CommDebugMode() as comm:
                t = mx_core.quantize(x, "fp8_e4m3", dim=block_dim)
            ref = mx_core.quantize(x.full_tensor(), "fp8_e4m3", dim=block_dim)
            out.append(
                (
                    comm.get_total_counts(),
                    t.qdata.placements == (Shard(shard_dim),),
                    t.scale.placements == (Shard(shard_dim),),
                    _same_shard(t.qdata, ref.qdata, shard_dim, rank),
                    _same_shard(t.scale, ref.scale, shard_dim, rank),
                )
            )
        results[rank] = out
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_quantize_keeps_dtensor_placements_without_communication():
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    mp.start_processes(_worker, args=(_free_port(), results), nprocs=WORLD, start_method="spawn")
    for rank in range(WORLD):
        for comms, qdata_kept, scale_kept, qdata_exact, scale_exact in results[rank]:
            assert comms == 0
            assert qdata_kept and scale_kept
            assert qdata_exact and scale_exact
