"""mx_nn.plan.resolve: which style each module of a torchtitan-named model (and of OLMo2 and
Phi-3) gets (no process group: the plan is only built here; test_parallelize.py and
test_real_models.py run it).

MX linears get mx-dtensor's MX styles with their own cast, everything else PyTorch's;
the gathers move MX only with mx_comms and a shared MX input cast."""

import sys
from pathlib import Path

import pytest
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

import mx_nn
from mx_dtensor import MXColwiseParallel, MXRowwiseParallel, PrepareMXModuleInput
from mx_nn.plan.families import find_model_map
from mx_nn.plan.resolve import model_plan

sys.path.insert(0, str(Path(__file__).parent))
from parallel_models import titan_model  # noqa: E402


def _types(plan: dict) -> dict:
    return {k: type(v) for k, v in plan.items()}


def _plans(model, **kw):
    model_map = find_model_map(model)
    full = model_plan(model, model_map, **kw)
    first, inside = f"{model_map.blocks[0]}.", tuple(f"{b}." for b in model_map.blocks)
    block = {k[len(first) :]: v for k, v in full.items() if k.startswith(first)}
    return block, {k: v for k, v in full.items() if not k.startswith(inside)}


def test_mx_block_gets_mx_styles_in_torchtitan_order():
    model = mx_nn.convert(titan_model(), "mxfp8_e5m2_grads", filter_fn=lambda _m, f: f != "output")
    block, root = _plans(model, sequence_parallel=True, mx_comms=True)
    col, row = MXColwiseParallel, MXRowwiseParallel
    assert list(_types(block).items()) == [
        ("attention_norm", SequenceParallel),
        ("attention", PrepareMXModuleInput),
        ("attention.wq", col),
        ("attention.wk", col),
        ("attention.wv", col),
        ("attention.wo", row),
        ("ffn_norm", SequenceParallel),
        ("feed_forward", PrepareMXModuleInput),
        ("feed_forward.w1", col),
        ("feed_forward.w3", col),
        ("feed_forward.w2", row),
    ]
    wq, wo, gather = block["attention.wq"], block["attention.wo"], block["attention"]
    assert (wq.fmt, wq.block_size, wq.scale_mode) == ("fp8_e4m3", 32, "rceil")
    assert wo.output_layouts == (Shard(1),) and not wo.use_local_output
    assert (gather.fmt, gather.block_size) == ("fp8_e4m3", 32)
    # The head stays high precision: PyTorch's style, its gather in bf16.
    assert _types(root) == {
        "tok_embeddings": RowwiseParallel,
        "norm": SequenceParallel,
        "output": ColwiseParallel,
    }
    assert root["output"].input_layouts == (Shard(1),)


def test_without_mx_comms_the_gathers_stay_high_precision():
    model = mx_nn.convert(titan_model(), "mxfp8")  # the head too
    block, root = _plans(model, sequence_parallel=True, mx_comms=False)
    assert type(block["attention"]) is PrepareModuleInput
    assert type(block["attention.wq"]) is MXColwiseParallel
    assert type(root["output"]) is ColwiseParallel  # its Shard(1) gather stays bf16
    block, root = _plans(model, sequence_parallel=True, mx_comms=True)
    assert type(root["output"]) is MXColwiseParallel  # its gather moves MX
    assert root["output"].input_layouts == (Shard(1),)
    block, root = _plans(model, sequence_parallel=False, mx_comms=False)
    assert type(root["output"]) is MXColwiseParallel
    assert root["output"].input_layouts == (Replicate(),)  # nothing to gather
    assert type(block["attention.wo"]) is MXRowwiseParallel
    assert block["attention.wo"].output_layouts == (Replicate(),)


def test_unconverted_and_mixed_casts_keep_pytorch_styles():
    block, _ = _plans(titan_model(), sequence_parallel=True, mx_comms=True)
    assert {type(v) for k, v in block.items() if "." in k} == {ColwiseParallel, RowwiseParallel}
    assert type(block["attention"]) is PrepareModuleInput
    # q in fp8 e5m2, k and v in e4m3: one MX gather cannot give each its own cast.
    model = titan_model()
    mx_nn.convert(model, "mxfp8", filter_fn=lambda _m, f: ".attention.wq" not in f)
    e5m2 = mx_nn.MXLinearConfig(input_fmt="fp8_e5m2")
    mx_nn.convert(model, e5m2, filter_fn=lambda _m, f: ".attention.wq" in f)
    block, _ = _plans(model, sequence_parallel=True, mx_comms=True)
    assert type(block["attention"]) is PrepareModuleInput
    assert block["attention.wq"].fmt == "fp8_e5m2" and block["attention.wk"].fmt == "fp8_e4m3"
    assert type(block["feed_forward"]) is PrepareMXModuleInput


def test_olmo2_norms_and_phi3_parts_get_their_styles():
    pytest.importorskip("transformers")
    from real_models import hf

    from mx_nn.plan.fused import SplitLinearParallel, split_fused
    from mx_nn.plan.norms import HeadShardedNorm

    block, _ = _plans(hf("olmo2"), sequence_parallel=True, mx_comms=True)
    assert type(block["self_attn.q_norm"]) is HeadShardedNorm
    assert type(block["self_attn.k_norm"]) is HeadShardedNorm
    # Qwen3's q_norm is per head ([head_dim]): no style, each rank's heads are whole.
    block, _ = _plans(hf("qwen3"), sequence_parallel=True, mx_comms=True)
    assert not any("norm" in k and "self_attn" in k for k in block), block
    phi3 = hf("phi3", pad_token_id=0)
    assert find_model_map(phi3) is None  # fused: not a family until split
    split = split_fused(phi3)
    assert split.fqns[:2] == (
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.mlp.gate_up_proj",
    )
    mx_nn.convert(phi3, "mxfp8", filter_fn=lambda _m, f: f != "lm_head")
    block, _ = _plans(phi3, sequence_parallel=True, mx_comms=True)
    assert list(_types(block).items())[1:8] == [
        ("self_attn", PrepareMXModuleInput),
        ("self_attn.qkv_proj", SplitLinearParallel),
        ("self_attn.qkv_proj.q", MXColwiseParallel),
        ("self_attn.qkv_proj.k", MXColwiseParallel),
        ("self_attn.qkv_proj.v", MXColwiseParallel),
        ("self_attn.o_proj", MXRowwiseParallel),
        ("post_attention_layernorm", SequenceParallel),
    ]
    assert type(block["mlp.gate_up_proj"]) is SplitLinearParallel
    assert type(block["mlp.gate_up_proj.up"]) is MXColwiseParallel
