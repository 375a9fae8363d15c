"""mx_nn.parallelize on CPU gloo groups of 2 and 4 ranks: TP, TP+SP, FSDP2 and dp x tp
give the outputs, gradients and losses of the same model on one process; checkpoints
load across TP degrees; every refused input has its message.

Tolerance: TP splits the reductions of the rowwise GEMMs across ranks (partial sums
added in another order), so logits and gradients differ from one process by rounding
only: REL = 1e-4, as for the 5 training steps' losses. FSDP2 alone runs each rank's
forward with the same arithmetic as one process: its logits are bit-exact.
"""

import sys
from pathlib import Path

import pytest
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
from parallel_checks import bad_inputs, checkpoints, equivalence, fallbacks_and_options  # noqa: E402
from parallel_models import spawn  # noqa: E402

REL = 1e-4
needs_dist = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable")

# (name, model, mesh shape, mesh dim names, recipe, parallelize kwargs). TP with MX
# recipes needs the DTensor sharding rules of the mx ops; until then TP runs the models'
# own nn.Linear layers, and MX is checked under FSDP2 (which gathers whole weights).
TWO_RANKS = [
    ("titan tp", "titan", (2,), ("tp",), None, {"sequence_parallel": False}),
    ("titan tp+sp", "titan", (2,), ("tp",), None, {}),
    ("hf tp", "hf", (2,), ("tp",), None, {"sequence_parallel": False}),
    ("hf tp+sp", "hf", (2,), ("tp",), None, {}),
    ("titan fsdp mxfp8", "titan", (2,), ("dp",), "mxfp8", {}),
    ("hf fsdp mxfp8", "hf", (2,), ("dp",), "mxfp8", {}),
]
FOUR_RANKS = [
    ("titan dp2 x tp2", "titan", (2, 2), ("dp", "tp"), None, {}),
    ("hf dp2 x tp2", "hf", (2, 2), ("dp", "tp"), None, {}),
    ("hf tp4+sp", "hf", (4,), ("tp",), None, {}),
]
# Collectives of one forward (2 blocks): with SP one all-gather per attention and MLP
# input plus the head's input and output, one reduce-scatter per rowwise layer and the
# embedding; without SP all-reduces instead, and the head's output all-gather.
SP_COMMS = {"all_gather_into_tensor": 6, "reduce_scatter_tensor": 5}
TP_COMMS = {"all_gather_into_tensor": 1, "all_reduce": 5}


def _check_equivalence(results: dict) -> None:
    for name, r in results.items():
        assert r["keys_kept"], name
        assert r["logits"] <= REL, (name, r["logits"])
        worst = max(r["grads"], key=r["grads"].get)
        assert r["grads"][worst] <= REL, (name, worst, r["grads"][worst])
        for ref, par in zip(r["losses"]["ref"], r["losses"]["par"], strict=True):
            assert abs(par - ref) <= REL * abs(ref), (name, r["losses"])
        if "fsdp" in name:
            assert r["logits"] == 0.0, name
            assert r["comms"] == {}, name
        else:
            assert r["comms"] == (SP_COMMS if "sp" in name or "x" in name else TP_COMMS), (
                name,
                r["comms"],
            )


@needs_dist
def test_two_ranks_tp_sp_fsdp_bad_inputs_and_options():
    results = spawn(equivalence, 2, TWO_RANKS)
    for rank_result in results:
        _check_equivalence(rank_result)

    errors = spawn(bad_inputs, 2)[0]
    assert (
        "mesh_dim_names=('dp', 'tp'), got a 2-D mesh with mesh_dim_names=('a', 'b')"
        in errors["2-D mesh named (a, b)"]
    )
    assert "got a 3-D mesh" in errors["3-D mesh"]
    assert errors["mesh not a DeviceMesh"].startswith("TypeError: mesh must be")
    assert errors["recipe not a recipe"].startswith("TypeError: recipe must be")
    assert "recipe='mxfp9' is not a recipe" in errors["unknown recipe"]
    assert "found the linears [0, 2]" in errors["unmappable model"]
    assert (
        "self_attn.q_proj" in errors["unmappable model"]
        and "attention.wq" in errors["unmappable model"]
    )
    assert "plan key 'layers.*.wq' matches no module" in errors["plan key matching nothing"]
    assert errors["plan value not a style"].startswith(
        "TypeError: plan['0'] must be a ParallelStyle"
    )
    assert "8 query and 1 key/value heads" in errors["kv heads not divisible"]
    assert (
        "w1.out_features=96 splits into shards of 48 at tp=2" in errors["MX shard not whole blocks"]
    )
    assert errors["model untouched after refusal"] is True
    assert "num_embeddings=255 is not divisible" in errors["vocab not divisible"]
    assert (
        "got input shape (1, 63); pad the sequence by 1 tokens" in errors["sequence not divisible"]
    )

    opts = spawn(fallbacks_and_options, 2)[0]
    assert opts["no embedding: logits"] <= REL and opts["no embedding: norms replicated"]
    assert opts["explicit plan: logits"] <= REL and opts["explicit plan: only its modules"]
    assert opts["mx_lm_head converts the head"] and opts["head stays high precision"]
    assert opts["compile: loss"] <= REL and opts["compile: grad wq"] <= REL
    assert opts["compile: blocks compiled"]
    log = opts["log"]
    assert sum("sequence parallelism not applied (no embedding found" in m for m in log) == 1
    assert (
        "mx_nn.parallelize: torchtitan Llama plan on 2 blocks, tp=2, sequence_parallel=False" in log
    )


@needs_dist
def test_four_ranks_dp_x_tp_tp4_and_checkpoints_across_degrees(tmp_path):
    for rank_result in spawn(equivalence, 4, FOUR_RANKS):
        _check_equivalence(rank_result)
    for kind in ("titan", "hf"):
        r = spawn(checkpoints, 4, kind, str(tmp_path / kind))[0]
        assert r["keys"], kind
        saved = r["tp=2 (saved run)"]
        for name in ("tp=4", "tp=1", "plain"):
            for got, want in zip(r[name], saved, strict=True):
                assert abs(got - want) <= 1e-6 * abs(want), (kind, name, r)
        assert r["tp=1"] == r["plain"], kind  # one rank: the plain model's arithmetic
