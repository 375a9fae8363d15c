"""convert on torchtitan's own Llama3Model (its linears are torchtitan's ``Linear``, an
nn.Linear subclass that keeps nn.Linear's forward), as a torchtitan user runs it: build,
``init_states``, convert, forward, backward.

Tolerance: MX against the unconverted model, as SQNR. One MXLinear holds its output to
27 dB and its gradients to 24-25 dB of high precision (test_linear); through the 5 or 7
linears of each of 2 blocks and the head the logits measure 28.4 dB and the worst
parameter gradient 21.6 dB, held here to 25 and 18 dB.
"""

from __future__ import annotations

import copy
import logging
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mx_nn
from mx_core.testing import sqnr_db
from mx_nn import MXLinear

pytest.importorskip("torchtitan")

from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm  # noqa: E402
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config  # noqa: E402
from torchtitan.models.common.linear import ScaledBiasRowwiseLinear  # noqa: E402
from torchtitan.models.llama3 import Llama3Model  # noqa: E402
from torchtitan.models.llama3.model import Llama3TransformerBlock  # noqa: E402

DIM, HEADS, KV_HEADS, FFN, VOCAB, LAYERS, SEQ = 128, 4, 2, 256, 256, 2, 32
LOGITS_DB, GRADS_DB = 25.0, 18.0


def _linear_init() -> dict:
    return {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}


def _norm() -> RMSNorm.Config:
    return RMSNorm.Config(normalized_shape=DIM, param_init={"weight": nn.init.ones_})


def _llama3(fuse_qkv: bool) -> Llama3Model:
    """torchtitan's debug model at a tiny size: its block layout and inits, with SDPA
    (its flex attention compiles, which a CPU test need not wait for)."""
    rope = ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=SEQ, theta=500000)
    block = partial(
        Llama3TransformerBlock.Config,
        attention_norm=_norm(),
        ffn_norm=_norm(),
        attention=make_gqa_config(
            dim=DIM,
            n_heads=HEADS,
            n_kv_heads=KV_HEADS,
            wqkv_param_init=_linear_init(),
            wo_param_init=_linear_init(),
            inner_attention=ScaledDotProductAttention.Config(),
            fuse_qkv=fuse_qkv,
            rope=rope,
        ),
        feed_forward=make_ffn_config(
            dim=DIM, hidden_dim=FFN, w1_param_init=_linear_init(), w2w3_param_init=_linear_init()
        ),
    )
    config = Llama3Model.Config(
        dim=DIM,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(
            num_embeddings=VOCAB, embedding_dim=DIM, param_init={"weight": nn.init.normal_}
        ),
        norm=_norm(),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_linear_init()),
        layers=[block() for _ in range(LAYERS)],
    )
    torch.manual_seed(0)
    model = config.build()
    model.init_states()
    return model


def _loss(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    return logits, loss


@pytest.mark.parametrize(
    ("fuse_qkv", "attention"),
    [
        (True, ["qkv_linear.wqkv", "wo"]),
        (False, ["qkv_linear.wq", "qkv_linear.wk", "qkv_linear.wv", "wo"]),
    ],
    ids=["fused_qkv", "separate_qkv"],
)
def test_llama3_every_linear_is_converted_and_trains_close_to_the_original(
    fuse_qkv, attention, caplog
):
    model = _llama3(fuse_qkv)
    reference = copy.deepcopy(model)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        assert mx_nn.convert(model, "mxfp8") is model
    expected = [
        *(f"layers.{i}.attention.{a}" for i in range(LAYERS) for a in attention),
        *(f"layers.{i}.feed_forward.w{j}" for i in range(LAYERS) for j in (1, 2, 3)),
        "lm_head",  # convert has no notion of a head (parallelize leaves it out)
    ]
    converted = {fqn for fqn, m in model.named_modules() if isinstance(m, MXLinear)}
    assert converted == set(expected)
    assert not any(type(m) is Linear for m in model.modules())
    n = len(expected)
    assert [r.getMessage() for r in caplog.records if r.name == "mx_nn"] == [
        f"mx_nn.convert: {n} torchtitan.models.common.linear.Linear layer(s) became plain "
        "MXLinear, without that class's other attributes and methods (initialise weights "
        "before convert)",
        f"mx_nn.convert: {n} of {n} linears converted to MX (mxfp8); 0 left alone",
    ]
    # The same Parameter objects and state_dict (the fused layout saves wq/wk/wv).
    assert all(p is params[name] for name, p in model.named_parameters())
    after = model.state_dict()
    assert list(after) == list(sd) and all(torch.equal(after[k], sd[k]) for k in sd)

    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    want, want_loss = _loss(reference, tokens)
    got, got_loss = _loss(model, tokens)
    assert torch.isfinite(got_loss) and sqnr_db(want, got) >= LOGITS_DB
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None and sqnr_db(grads[name].grad, p.grad) >= GRADS_DB, name


def test_init_states_after_convert_leaves_the_mx_layers_as_they_are():
    # torchtitan's init_states walks its own Module types only: an MXLinear is skipped,
    # which is why convert runs after init.
    model = mx_nn.convert(_llama3(fuse_qkv=True), "mxfp8")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    model.init_states()
    for fqn, m in model.named_modules():
        if isinstance(m, MXLinear):
            assert torch.all(m.weight == 0.5), fqn
    assert not torch.all(model.tok_embeddings.weight == 0.5)  # the rest is initialised again


def test_torchtitans_linear_overriding_forward_is_left_alone(caplog):
    rowwise = ScaledBiasRowwiseLinear.Config(in_features=64, out_features=64, bias=True).build()
    model = nn.Sequential(Linear.Config(in_features=64, out_features=64).build(), rowwise)
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        mx_nn.convert(model, "mxfp8")
    assert isinstance(model[0], MXLinear) and model[1] is rowwise
    messages = [r.getMessage() for r in caplog.records if r.name == "mx_nn"]
    assert messages[0] == "mx_nn.convert: 1 left alone: overrides forward (ScaledBiasRowwiseLinear)"
    summary = "mx_nn.convert: 1 of 2 linears converted to MX (mxfp8); 1 left alone (see above)"
    assert messages[-1] == summary
