"""parallelize on the model classes of the installed torchtitan and transformers (tiny
random configs, their default tying), at tp=2 with sequence parallelism on 2 gloo ranks,
against the same model on one process; OLMo2 (its q_norm and k_norm over all heads) also
without sequence parallelism; torchtitan's Llama3 also at tp=4 and dp=2 x tp=2 (FSDP2)
on 4 ranks, and Gemma's tied LM head and embedding at dp=2 x tp=2 (AdamW). Every rank
feeds the whole batch (the dp ranks' gradients average to the one-process gradient)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from mx_dtensor.testing import spawn

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
from real_models import BUILDERS, check, tied_check  # noqa: E402

pytest.importorskip("transformers")
needs_dist = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")
HAS_TITAN = importlib.util.find_spec("torchtitan") is not None
needs_titan = pytest.mark.skipif(not HAS_TITAN, reason="torchtitan not installed "
                                 "(tools/install-torchtitan.sh; Python >= 3.11)")  # fmt: skip

MODELS = [n for n in BUILDERS if HAS_TITAN or not n.startswith("torchtitan")]
LOGITS = 1e-4  # relative error of the logits, high precision (fp32) at tp=2
LOSS = 5e-3  # the documented training-loss tolerance


def _assert_matches(r: dict, names: list[str]) -> None:
    for name in names:
        res = r[name]
        assert "refused" not in res, (name, res)
        assert res["logits"] <= LOGITS, (name, res["logits"])
        for a, b in zip(res["losses"]["par"], res["losses"]["ref"], strict=True):
            assert abs(a - b) <= LOSS * abs(b), (name, res["losses"])
        before, after = res["tie"]
        assert after == before, (name, "parameter elements and tie", before, after)


@needs_dist
@pytest.mark.parametrize("recipe", [None, "mxfp8"])
def test_real_models_at_tp2_with_sequence_parallelism(recipe):
    r = spawn(check, 2, MODELS, recipe)[0]
    _assert_matches(r, MODELS)
    assert r["Gemma (tied)"]["tie"][1][1], "Gemma's LM head stays tied to its embedding"


@needs_dist
@pytest.mark.parametrize(
    "recipe",
    [
        None,
        "mxfp8",
    ],
)
def test_olmo2_at_tp2_without_sequence_parallelism(recipe):
    # Its q_norm and k_norm sit inside attention, where the layouts are the same with
    # and without SP: each rank's heads, reduced over all of them.
    _assert_matches(spawn(check, 2, ["OLMo2"], recipe, None, None, False)[0], ["OLMo2"])


TITAN = [n for n in BUILDERS if n.startswith("torchtitan")]


@needs_dist
@pytest.mark.parametrize(
    "shape,dims", [((4,), None), ((2, 2), ("dp", "tp"))], ids=["tp4", "dp2xtp2"]
)
def test_torchtitan_llama3_on_four_ranks(shape, dims):
    r = spawn(check, 4, TITAN, "mxfp8", shape, dims)[0]
    for name in TITAN:
        res = r[name]
        assert "refused" not in res, (name, res)
        assert res["logits"] <= LOGITS, (name, res["logits"])
        for a, b in zip(res["losses"]["par"], res["losses"]["ref"], strict=True):
            assert abs(a - b) <= LOSS * abs(b), (name, res["losses"])


@needs_dist
@pytest.mark.parametrize("recipe", [None, "mxfp8"])
def test_tied_gemma_on_dp2_x_tp2(recipe):
    # FSDP2 shards the root's parameters once each: the head and the embedding stay one
    # Parameter (one DTensor, Shard(0) on "tp" and FSDP's split on "dp"), with one
    # gradient and one optimizer state.
    r = spawn(tied_check, 4, recipe)[0]
    assert r["tied"] and r["grad"] and r["tied state"], r
    assert r["names of the tied Parameter"] == ["lm_head.weight", "model.embed_tokens.weight"]
    assert r["parameters"] == r["states"] == r["ref parameters"], r
    assert r["placements"].endswith("Shard(dim=0))"), r["placements"]
    for a, b in zip(r["losses"]["par"], r["losses"]["ref"], strict=True):
        assert abs(a - b) <= LOSS * abs(b), r["losses"]
