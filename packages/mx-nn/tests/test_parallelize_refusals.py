"""mx_nn.parallelize refuses, before it changes anything, a model that is parallelized
already (by itself, fully_shard or parallelize_module) and arguments of the wrong type
or that cannot apply; a refused call leaves the model as it was: module types, head
counts, hooks, state_dict and outputs (bit-exact: nothing ran on it)."""

import re
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
from parallel_models import DIM, RMSNorm, titan_model  # noqa: E402

import mx_nn  # noqa: E402
from mx_dtensor.testing import spawn  # noqa: E402

needs_dist = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable")
TOKENS = (2, 64)
_ATTRS = ("n_heads", "n_kv_heads", "num_heads", "num_key_value_heads", "head_dim")


def _error(fn) -> str:
    """The message of the exception ``fn()`` raises, prefixed by its type."""
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    except Exception as e:  # any other type is a failure the test shows
        return f"unexpected {type(e).__name__}: {e}"
    return "no error"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _snapshot(model: nn.Module) -> dict:
    """What a refused call must leave as it was: module types, head-count attributes,
    hook counts, the state_dict (local shards) and the logits of a fixed batch."""
    tokens = torch.randint(0, 256, TOKENS, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
    return {
        "types": [(fqn, type(m)) for fqn, m in model.named_modules()],
        "attrs": [
            (fqn, a, getattr(m, a))
            for fqn, m in model.named_modules()
            for a in _ATTRS
            if hasattr(m, a)
        ],  # fmt: skip
        "hooks": [
            (fqn, len(m._forward_pre_hooks), len(m._forward_hooks))
            for fqn, m in model.named_modules()
        ],  # fmt: skip
        "state": {k: _local(v).clone() for k, v in model.state_dict().items()},
        "logits": _local(logits).clone(),
    }


def _same(a: dict, b: dict) -> bool:
    tensors_equal = a["state"].keys() == b["state"].keys() and all(
        torch.equal(a["state"][k], b["state"][k]) for k in a["state"]
    )
    plain = all(a[k] == b[k] for k in ("types", "attrs", "hooks"))
    return plain and tensors_equal and torch.equal(a["logits"], b["logits"])


def _refused(model: nn.Module, call) -> tuple[str, bool]:
    """(the error of ``call(model)``, whether ``model`` is as it was before)."""
    before = _snapshot(model)
    message = _error(lambda: call(model))
    try:
        return message, _same(before, _snapshot(model))
    except Exception as e:  # the model no longer runs
        return f"{message}; then the model's forward raised {e}", False


def _refusals_worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from mx_dtensor import MXColwiseParallel

    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    tp1 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("rep", "tp"))["tp"]
    out = {}

    def again(recipe="mxfp8", mesh=tp):
        return lambda model: mx_nn.parallelize(model, mesh, recipe=recipe)

    # Already parallelized: by parallelize itself (tp=2, tp=1, FSDP2 alone), by
    # parallelize_module, by fully_shard of the root or of one block.
    def done():
        return mx_nn.parallelize(titan_model(), tp, recipe="mxfp8")

    out["twice"] = _refused(done(), again())
    out["twice, another recipe"] = _refused(done(), again("mxfp4"))
    out["twice, fsdp"] = _refused(done(), again(mesh=dp))
    out["after tp=1"] = _refused(mx_nn.parallelize(titan_model(), tp1), again())
    out["after fsdp"] = _refused(mx_nn.parallelize(titan_model(), dp), again())
    model = titan_model()
    # The output gathered, so that the model's forward still runs with its head counts.
    wq = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, tp, {"layers.0.attention.wq": wq})
    out["after parallelize_module"] = _refused(model, again())
    out["after fully_shard of a block"] = _refused(
        _sharded(titan_model(), "layers.1", dp, fully_shard), again(mesh=dp)
    )

    # Explicit plans whose styles PyTorch or mx-dtensor refuse when they are applied,
    # which is after convert (and after the styles of the plan's earlier modules).
    plan = {
        "layers.0.attention.wq": ColwiseParallel(),
        "layers.0.attention_norm": ColwiseParallel(),
    }
    out["plan: style on a norm"] = _refused(
        titan_model(), lambda m: mx_nn.parallelize(m, tp, plan=plan)
    )
    odd = titan_model()
    odd.layers[1].feed_forward.w1 = nn.Linear(DIM, 96, bias=False)
    odd.layers[1].feed_forward.w3 = nn.Linear(DIM, 96, bias=False)
    odd.layers[1].feed_forward.w2 = nn.Linear(96, DIM, bias=False)
    mx_plan = {
        "layers.*.attention.wq": MXColwiseParallel(),
        "layers.*.feed_forward.w1": MXColwiseParallel(),
    }
    out["plan: MX shard not whole blocks"] = _refused(
        odd, lambda m: mx_nn.parallelize(m, tp, plan=mx_plan)
    )

    # Arguments that cannot apply or are of the wrong type.
    out["compile not a bool"] = _refused(
        titan_model(), lambda m: mx_nn.parallelize(m, tp, compile="no")
    )
    out["sequence_parallel not a bool"] = _refused(
        titan_model(), lambda m: mx_nn.parallelize(m, tp, sequence_parallel=None)
    )
    out["plan on a dp mesh"] = _refused(
        titan_model(),
        lambda m: mx_nn.parallelize(m, dp, plan={"layers.0.attention.wq": ColwiseParallel()}),
    )
    out["plan key not a str"] = _refused(
        titan_model(), lambda m: mx_nn.parallelize(m, tp, plan={0: ColwiseParallel()})
    )
    out["mx_lm_head without a recipe"] = _refused(
        titan_model(), lambda m: mx_nn.parallelize(m, tp, recipe=None, mx_lm_head=True)
    )
    seq = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    out["compile without blocks"] = _error(
        lambda: mx_nn.parallelize(seq, tp, plan={"0": ColwiseParallel()}, compile=True)
    )
    tied = titan_model()
    # A tie the plan cannot keep (the head-embedding tie it keeps: test_real_models.py).
    tied.get_submodule("layers.1.attention.wq").weight = tied.get_submodule(
        "layers.0.attention.wq"
    ).weight
    out["tied weights under tp"] = _refused(tied, again())
    # A norm over all heads that the plan does not split (BitNet's attn_sub_norm; OLMo2's
    # q_norm and k_norm are planned): refused under TP.
    normed = titan_model()
    normed.layers[0].attention.sub_norm = RMSNorm(DIM)
    out["norm across heads"] = _refused(normed, again())
    converted = mx_nn.convert(titan_model(), "mxfp8")
    out["recipe other than the model's"] = _refused(converted, again("mxfp4"))
    return out


def _sharded(model: nn.Module, fqn: str, mesh, fully_shard) -> nn.Module:
    fully_shard(model.get_submodule(fqn), mesh=mesh)
    return model


@needs_dist
def test_refused_calls_leave_the_model_as_it_was():
    results = spawn(_refusals_worker, 2)
    for r in results:
        for name, result in r.items():
            if isinstance(result, tuple):  # (message, model unchanged)
                assert result[1], (name, result[0])
    r = results[0]
    for name in ("twice", "twice, another recipe", "twice, fsdp", "after tp=1", "after fsdp"):
        want = r"ValueError: model must not be parallelized yet, but (FSDP)?TitanLlama is: "
        want += r"mx_nn\.parallelize already ran on it \(mesh shape"
        assert re.match(want, r[name][0]), (name, r[name])
    assert "call it on a freshly built model" in r["twice"][0]
    assert "(mesh shape (2,), names ('tp',))" in r["twice"][0]
    assert "'layers.0.attention.wq.weight' is already a DTensor" in r["after parallelize_module"][0]
    assert (
        "fully_shard (FSDP2) already ran on its submodule 'layers.1'"
        in (r["after fully_shard of a block"][0])
    )
    assert r["plan: style on a norm"][0] == (
        "TypeError: plan: ColwiseParallel on 'layers.0.attention_norm' shards Linear and "
        "Embedding modules (and subclasses), but 'layers.0.attention_norm' is a RMSNorm"
    )
    assert r["plan: MX shard not whole blocks"][0].startswith(
        "ValueError: MXColwiseParallel: Linear (in_features=256, out_features=96): "
        "out_features=96 splits into [48] per rank at tp=2"
    )
    assert (
        r["compile not a bool"][0] == "TypeError: compile must be a bool (True or False), got 'no'"
    )
    assert r["sequence_parallel not a bool"][0].startswith("TypeError: sequence_parallel must be")
    assert r["plan on a dp mesh"][0].startswith(
        "ValueError: plan= is a tensor-parallel plan, but mesh_dim_names=('dp',) has no"
    )
    assert r["plan key not a str"][0] == "TypeError: plan keys must be fqn pattern strings, got 0"
    assert r["mx_lm_head without a recipe"][0].startswith("ValueError: mx_lm_head=True converts")
    assert r["compile without blocks"].startswith(
        "ValueError: compile=True compiles each decoder block, but Sequential has none"
    )
    assert r["tied weights under tp"][0] == (
        "ValueError: model ties 'layers.0.attention.wq.weight' and 'layers.1.attention.wq.weight' "
        "(one Parameter), but tensor parallelism (tp=2) shards each module's parameters into a "
        "DTensor of its own, which would untie them (only the LM head's tie to the embedding "
        "is kept: both split along the vocabulary); untie them first (e.g. "
        "tie_word_embeddings=False) or use tp=1"
    )
    assert r["norm across heads"][0].startswith(
        "ValueError: parallelize cannot split layers.0.attention: its sub_norm (RMSNorm, "
        "parameters [(256,)]) works across heads (head_dim=32)"
    ), r["norm across heads"]
    assert (
        "layer(s) are already MXLinear with another config"
        in (r["recipe other than the model's"][0])
    )


@pytest.mark.parametrize("model", ["hello", None])
def test_model_not_a_module_is_a_type_error(model):
    # The model is checked first, so no process group or mesh is needed to see it.
    with pytest.raises(
        TypeError, match=r"model must be a torch.nn.Module, got .*\((str|NoneType)\)"
    ):
        mx_nn.parallelize(model, None)
