import logging

import torch
from torch import nn

import mx_nn
from mx_nn import MXLinear


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 128),
        nn.ReLU(),
        nn.Sequential(nn.Linear(128, 96, bias=False), nn.Linear(96, 10)),
    ).to(torch.bfloat16)


def test_swaps_in_place_keeping_parameters_and_logs_skips(caplog):
    model = _model()
    params = {name: p for name, p in model.named_parameters()}
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        out = mx_nn.convert(model, "mxfp8")
    assert out is model
    assert isinstance(model[0], MXLinear) and isinstance(model[2][0], MXLinear)
    assert type(model[2][1]) is nn.Linear  # 10 outputs: not a multiple of 32
    assert "kept 2.1 as nn.Linear" in caplog.text
    assert model[2][0].fqn == "2.0" and "MXLinear '2.0' (in_features=128" in model[2][0].layer_name
    for name, p in model.named_parameters():
        assert p is params[name]


def test_state_dict_round_trip_bf16_mx_bf16():
    plain = _model()
    sd = plain.state_dict()
    mx_model = mx_nn.convert(_model())
    mx_model.load_state_dict(sd)
    sd_mx = mx_model.state_dict()
    assert list(sd_mx) == list(sd)
    assert all(sd_mx[k].dtype == sd[k].dtype and torch.equal(sd_mx[k], sd[k]) for k in sd)
    back = _model()
    back.load_state_dict(sd_mx)
    assert all(torch.equal(back.state_dict()[k], sd[k]) for k in sd)


def test_converting_twice_is_a_no_op_and_filter_fn_selects():
    model = mx_nn.convert(_model(), filter_fn=lambda module, fqn: fqn != "0")
    assert type(model[0]) is nn.Linear and isinstance(model[2][0], MXLinear)
    first = model[2][0]
    mx_nn.convert(model, filter_fn=lambda module, fqn: fqn != "0")
    assert model[2][0] is first


def test_root_linear_and_config_objects():
    config = mx_nn.MXLinearConfig.from_recipe("mxfp8_floor")
    lin = nn.Linear(64, 64)
    new = mx_nn.convert(lin, config)
    assert isinstance(new, MXLinear) and new.config is config and new.weight is lin.weight
