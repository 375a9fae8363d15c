"""parallelize(..., fsdp_mx_all_gather=True) on CPU gloo groups (dp=2; dp=2 x tp=2): the
same logits, gradients, training losses and weights bit for bit as the high-precision
FSDP2 gathers, on both MXLinear compute paths (mxfp8; mxfp4, whose codes pack two per
byte along the blocks); the bytes each pass's all-gathers move
for the MXLinear weights; checkpoints stay plain; every refusal and misuse raises.

Bytes: counted by wrapping FSDP2's foreach_all_gather (mx_nn never calls it), from each
collective's output buffer (this rank sends 1/world of it) split into the parameters'
inputs that FSDP concatenated into it (they must add up to the buffer). MX moves
N_r * K * (1 + 1/32) bytes per weight shard [N_r, K] (mxfp4: 1/2 + 1/32), the
high-precision gather N_r * K * itemsize: 0.516x for bf16 weights, 0.258x for fp32.
What autograd keeps from forward to backward is measured from the tensors it saves.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
from fsdp_mx_checks import four_rank_suite, two_rank_suite  # noqa: E402

from mx_dtensor.testing import spawn  # noqa: E402

needs_dist = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable")
BYTES_RATIO = 0.55  # mxfp8 against bf16 gathers: (1 + 1/32) / 2 = 0.516

# (name, compute path, model dtype, bf16 autocast, recipe)
TWO_RANKS = [
    ("mx fp32", "mx", torch.float32, False, "mxfp8"),
    ("fake_quant bf16", "fake_quant", torch.bfloat16, False, "mxfp8"),
    ("mx fp32 autocast", "mx", torch.float32, True, "mxfp8"),
    ("mxfp4 mx bf16", "mx", torch.bfloat16, False, "mxfp4"),  # codes packed along blocks
]
FOUR_RANKS = [
    ("dp2 x tp2 fake_quant bf16", "fake_quant", torch.bfloat16, False, "mxfp8"),
    ("dp2 x tp2 mx fp32", "mx", torch.float32, False, "mxfp8"),
]


def _check_equivalence(results: dict) -> None:
    for name, r in results.items():
        assert r["wrapped"] == (14, 0), (name, r["wrapped"])  # 2 blocks x 7 MXLinear
        assert r["logits"], name
        assert r["grads"] == [], (name, r["grads"])
        on, off = r["losses"]
        assert on == off, (name, r["losses"])
        assert r["values"] == [], (name, r["values"])
        assert r["keys"] and r["plain_sd"], name
        assert r["split_ok"], name
        # Kept from forward to backward: without the option each layer's colwise cast of
        # its whole (unsharded) weight as codes and scales on the MX path; the fused path
        # keeps the weight itself (save_mx_activations: cast along N in backward), which
        # FSDP frees by resizing; with it nothing (FSDP freed the gathered casts).
        (kept_on, gathered_on), (kept_off, _) = r["kept"]
        numel = r["local numel"]
        per_elem = {"mx": r["mx per elem"], "fake_quant": 0}[r["path"]]
        assert kept_off - kept_on == numel * r["dp"] * per_elem, (name, r["kept"])
        assert gathered_on == 0, (name, r["kept"])
        for pass_ in ("forward", "backward"):
            sent = r[pass_]
            assert sent["n mx"] == 14 and sent["others equal"], (name, pass_, sent)
            # Two forwards (one without grad) and one backward gather each weight.
            gathers = 2 if pass_ == "forward" else 1
            assert sent["mx"] == gathers * numel * r["mx per elem"], (name, pass_, sent)
            assert sent["hp"] == gathers * numel * r["hp itemsize"], (name, pass_, sent)
            assert sent["mx"] / sent["hp"] <= BYTES_RATIO * 2 / r["hp itemsize"], (name, sent)
            if r["hp itemsize"] == 2:
                assert sent["mx"] / sent["hp"] <= BYTES_RATIO, (name, pass_, sent)


@needs_dist
def test_two_ranks_mx_gathers_bit_identical_bytes_and_refusals():
    results = spawn(two_rank_suite, 2, TWO_RANKS)
    for rank_result in results:
        _check_equivalence(rank_result["equivalence"])
    errors = results[0]["refusals"]
    assert (
        "layers.1.feed_forward.w1.out_features=96 splits over dp=2 into rows [48, 48]"
        in errors["rows not whole blocks"]
    ), errors
    assert "MX block size 32" in errors["rows not whole blocks"]
    assert errors["model untouched"] is True
    assert "torch.compile" in errors["compile"] and "compile=False" in errors["compile"]
    assert "no 'dp' dim" in errors["no dp"]
    assert "no decoder block has an MXLinear" in errors["no MXLinear"]
    assert "activation checkpointing" in errors["activation checkpointing"]
    assert "explicit plan" in errors["explicit plan"]
    assert errors["after fully_shard"].startswith("ValueError: enable_fsdp_mx_all_gather must run")
    for e in errors.values():
        assert e is True or e.startswith("ValueError: "), e

    runtime = results[0]["runtime"]
    assert runtime["ok"] == "no error"
    for path in ("mx", "fake_quant"):
        regather = runtime[f"{path}: no re-gather"]
        assert regather.startswith("MXLinear 'lin' (in_features=64, out_features=128): backward")
        assert "reshard_after_forward=True" in regather, regather
        ckpt = runtime[f"{path}: checkpoint"]
        assert "forward needs the rowwise MX cast" in ckpt and "activation-checkpointing" in ckpt
    assert "which only MXLinear reads" in runtime["F.linear"], runtime["F.linear"]


@needs_dist
def test_four_ranks_dp_x_tp_bit_identical_and_checkpoint(tmp_path):
    results = spawn(four_rank_suite, 4, FOUR_RANKS, str(tmp_path / "ckpt"))
    for rank_result in results:
        _check_equivalence(rank_result["equivalence"])
        assert rank_result["saved sd plain"]
        assert rank_result["plain keys"] and rank_result["plain equal"] == []
        assert rank_result["reloaded logits"]
