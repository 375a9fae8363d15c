"""Bad input to an export gets a clear error and writes nothing."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import mx_nn
from mx_nn.export import export

sys.path.insert(0, str(Path(__file__).parent))
from export_helpers import hf_llama, listing, mx_llama  # noqa: E402


def _refused(tmp_path, match, call):
    before = listing(tmp_path)
    with pytest.raises(ValueError, match=match):
        call()
    assert listing(tmp_path) == before  # nothing written, not even a partial folder


def test_a_model_with_no_mx_layer(tmp_path):
    model = mx_nn.models.Llama(mx_nn.models.LlamaConfig(dim=64, n_heads=2, n_kv_heads=1))
    _refused(tmp_path, "has no MXLinear layer, so nothing to store in mxfp8",
             lambda: export(model, tmp_path / "out", "mxfp8"))  # fmt: skip


def test_a_scheme_the_model_was_not_trained_in(tmp_path):
    model = mx_llama("mxfp8")
    _refused(tmp_path, r"scheme='mxfp4' stores fp4_e2m1 weights, but 14 MX layer\(s\) "
             r"trained with fp8_e4m3 weights \('layers.0.attention.wq'",
             lambda: export(model, tmp_path / "out", "mxfp4"))  # fmt: skip
    fp6 = mx_nn.convert(nn.Sequential(nn.Linear(64, 64)), "mxfp6")
    _refused(tmp_path, "trained with fp6_e2m3 weights",
             lambda: export(fp6, tmp_path / "out", "mxfp8", hf_config={}))  # fmt: skip


def test_an_unknown_scheme(tmp_path):
    _refused(tmp_path, "scheme='nvfp4' is not an export scheme; allowed: mxfp8, mxfp4",
             lambda: export(mx_llama("mxfp8"), tmp_path / "out", "nvfp4"))  # fmt: skip


def test_an_existing_non_empty_out_dir(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    _refused(tmp_path, "is not empty; give a new or empty folder",
             lambda: export(mx_llama("mxfp8"), out, "mxfp8"))  # fmt: skip
    assert (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("")
    _refused(tmp_path, "is a file", lambda: export(mx_llama("mxfp8"), tmp_path / "file", "mxfp8"))


def test_an_empty_out_dir_is_written(tmp_path):
    (tmp_path / "out").mkdir()
    export(mx_llama("mxfp8"), tmp_path / "out", "mxfp8")
    assert (tmp_path / "out" / "config.json").is_file()


def test_a_non_finite_weight_leaves_nothing(tmp_path):
    model = mx_llama("mxfp8")
    with torch.no_grad():
        model.layers[1].feed_forward.w2.weight[3, 5] = float("nan")
    _refused(tmp_path, "'layers.1.feed_forward.w2.weight': 1 block",
             lambda: export(model, tmp_path / "out", "mxfp8"))  # fmt: skip


def test_a_model_without_a_config_needs_hf_config(tmp_path):
    model = mx_nn.convert(nn.Sequential(nn.Linear(64, 64)), "mxfp8")
    _refused(tmp_path, "pass hf_config=", lambda: export(model, tmp_path / "out", "mxfp8"))


def test_an_mx_head_tied_to_the_embedding(tmp_path):
    model = hf_llama("mxfp8", tied=True)
    config = model.model.layers[0].mlp.up_proj.config
    model.lm_head = mx_nn.MXLinear.from_linear(model.lm_head, config)  # shares the weight
    _refused(tmp_path, "are one tensor, and an MX layer's weight",
             lambda: export(model, tmp_path / "out", "mxfp8"))  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"compute_dtype": torch.int8}, "compute_dtype=torch.int8; allowed: None, torch.float32"),
    ({"max_shard_bytes": 0}, "max_shard_bytes=0 must be a positive int"),
    ({"tokenizer": "/nonexistent"}, "holds no tokenizer files"),
])  # fmt: skip
def test_bad_options(tmp_path, kwargs, match):
    _refused(tmp_path, match, lambda: export(mx_llama("mxfp8"), tmp_path / "out", "mxfp8",
                                             **kwargs))  # fmt: skip
