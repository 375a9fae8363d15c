"""parallelize on the model classes of the installed torchtitan and transformers (tiny
random configs, their default tying), at tp=2 with sequence parallelism on 2 gloo ranks,
against the same model on one process; torchtitan's Llama3 also at tp=4 and dp=2 x tp=2
(FSDP2) on 4 ranks. Every rank feeds the whole batch (the dp ranks' gradients average
to the one-process gradient)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from mx_dtensor.testing import spawn

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
from real_models import BUILDERS, check  # noqa: E402

pytest.importorskip("transformers")
needs_dist = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")
HAS_TITAN = importlib.util.find_spec("torchtitan") is not None
needs_titan = pytest.mark.skipif(not HAS_TITAN, reason="torchtitan not installed "
                                 "(tools/install-torchtitan.sh; Python >= 3.11)")  # fmt: skip

MODELS = [n for n in BUILDERS if HAS_TITAN or not n.startswith("torchtitan")]
PLANNED = [n for n in MODELS if n != "OLMo2"]
LOGITS = 1e-4  # relative error of the logits, high precision (fp32) at tp=2
LOSS = 5e-3  # the documented training-loss tolerance


@needs_dist
@pytest.mark.parametrize("recipe", [None, "mxfp8"])
def test_real_models_at_tp2_with_sequence_parallelism(recipe):
    r = spawn(check, 2, MODELS, recipe)[0]
    for name in PLANNED:
        res = r[name]
        assert "refused" not in res, (name, res)
        assert res["logits"] <= LOGITS, (name, res["logits"])
        for a, b in zip(res["losses"]["par"], res["losses"]["ref"], strict=True):
            assert abs(a - b) <= LOSS * abs(b), (name, res["losses"])
        before, after = res["tie"]
        assert after == before, (name, "parameter count and tie", before, after)
    assert r["Gemma (tied)"]["tie"][1][1], "Gemma's LM head stays tied to its embedding"
    # OLMo2 normalises q and k over all heads: refused before any change, naming it.
    refused = r["OLMo2"]["refused"]
    assert "q_norm" in refused and "works across heads" in refused, refused


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
