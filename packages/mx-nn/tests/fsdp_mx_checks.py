"""Checks run inside spawned gloo groups by test_fsdp_mx.py (importable by the spawned
ranks, which a test module under --import-mode=importlib is not)."""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
import torch.nn.functional as F
from parallel_checks import _error, _not_head, _tokens
from parallel_models import DIM, hf_model, logits_of, loss_of, titan_model
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.utils.checkpoint import checkpoint

import mx_nn
from mx_core import get_format
from mx_nn.fsdp.enable import enable_fsdp_mx_all_gather
from mx_nn.fsdp.weight import MXGatheredWeight

STEPS = 3
MX_LINEARS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


class GatherBytes:
    """Bytes this rank sends in FSDP2's all-gathers, per pass ("forward" / "backward",
    told apart as FSDP itself does: inside autograd's backward or not) and per parameter
    fqn. Read from each collective's own output buffer (this rank's input is 1/world of
    it) and split by the per-parameter input sizes FSDP concatenated into it; ``total``
    keeps each collective's size, which the parameters' bytes must add up to."""

    def __init__(self) -> None:
        self.bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.total: dict[str, int] = defaultdict(int)
        self.split_ok = True

    @contextlib.contextmanager
    def recording(self):
        original = _fsdp_param_group.foreach_all_gather

        def recorded(fsdp_params, group, *args, **kwargs):
            result = original(fsdp_params, group, *args, **kwargs)
            out = result.all_gather_output
            sent = out.numel() * out.element_size() // group.size()
            pass_ = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            sizes = zip(result.param_all_gather_input_numels,
                        result.param_all_gather_input_dtypes, strict=True)  # fmt: skip
            per = [sum(n * d.itemsize for n, d in zip(*s, strict=True)) for s in sizes]
            self.split_ok &= sum(per) == sent
            self.total[pass_] += sent
            for p, b in zip(fsdp_params, per, strict=True):
                self.bytes[pass_][p._param_fqn] += b
            return result

        _fsdp_param_group.foreach_all_gather = recorded
        try:
            yield self
        finally:
            _fsdp_param_group.foreach_all_gather = original

    def mx_weights(self, pass_: str) -> int:
        return sum(b for f, b in self.bytes[pass_].items() if f.split(".")[-2] in MX_LINEARS)

    def others(self, pass_: str) -> dict[str, int]:
        return {f: b for f, b in self.bytes[pass_].items() if f.split(".")[-2] not in MX_LINEARS}


def _dp_rank(mesh) -> tuple[int, int]:
    dp = mesh["dp"] if mesh.ndim == 2 else mesh
    return dp.get_local_rank(), dp.size()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _plain_values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: _local(v).clone() for k, v in model.state_dict().items()}


def _keep(saved: list):
    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    return pack


def _kept_bytes(saved: list[torch.Tensor]) -> tuple[int, int]:
    """Bytes of the storages autograd keeps for backward after a forward (each once),
    and of the MX gathers among them (FSDP has freed those after the blocks)."""
    seen, kept, gathered = set(), 0, 0
    for t in saved:
        local = _local(t)
        if isinstance(local, MXGatheredWeight):
            s = local._state
            gathered += s.codes.untyped_storage().nbytes() + s.scales.untyped_storage().nbytes()
            continue
        if isinstance(local, AsyncCollectiveTensor):  # sequence parallelism's gathers
            local = local.elem
        storage = local.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:  # FSDP frees by resizing
            seen.add(storage.data_ptr())
            kept += storage.nbytes()
    return kept, gathered


def _train(mesh, case: tuple, on: bool) -> dict:
    """One forward without grad, one backward, then STEPS AdamW steps, of the torchtitan
    model in the case's recipe and compute path, with or without MX all-gathers."""
    _name, path, dtype, autocast, recipe = case
    config = mx_nn.MXLinearConfig.from_recipe(recipe, compute_path=path)
    model = mx_nn.parallelize(titan_model().to(dtype), mesh, recipe=config,
                              fsdp_mx_all_gather=on)  # fmt: skip
    rank, dp = _dp_rank(mesh)
    amp = torch.autocast("cpu", torch.bfloat16, enabled=autocast)
    tokens = _tokens(0).chunk(dp)[rank]
    sent = GatherBytes()
    with sent.recording():
        with torch.no_grad(), amp:
            logits = logits_of(model, tokens)
        saved: list[torch.Tensor] = []
        with amp, torch.autograd.graph.saved_tensors_hooks(_keep(saved), lambda t: t):
            loss = loss_of(model, tokens)
        kept = _kept_bytes(saved)
        loss.backward()
    grads = {n: _local(p.grad).clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = [loss.item()]
    for step in range(STEPS):
        opt.step()
        opt.zero_grad()
        with amp:
            loss = loss_of(model, _tokens(step + 1).chunk(dp)[rank])
        loss.backward()
        losses.append(loss.item())
    sd = model.state_dict()
    plain = all(type(_local(v)) is torch.Tensor for v in sd.values())
    wrapped = sum(type(_local(p)).__name__ == "MXShardedWeight" for p in model.parameters())
    return {"model": model, "logits": logits, "grads": grads, "losses": losses, "sent": sent,
            "values": _plain_values(model), "keys": list(sd), "plain_sd": plain,
            "wrapped": wrapped, "kept": kept}  # fmt: skip


def _differ(a: dict, b: dict) -> list[str]:
    """The keys whose tensors are not bit-identical."""
    return [k for k in b if not torch.equal(a[k], b[k])]


def equivalence(mesh, cases: list[tuple]) -> tuple[dict, dict]:
    """Per case (name, compute path, dtype, autocast, recipe): the option on against off,
    bit for bit, and the bytes of each pass's all-gathers. Returns the results and the
    last case's option-on model (for the checkpoint checks)."""
    out, model = {}, None
    for case in cases:
        name, path, dtype, autocast, recipe = case
        off = _train(mesh, case, on=False)
        on = _train(mesh, case, on=True)
        model = on["model"]
        r = {
            "logits": torch.equal(on["logits"], off["logits"]),
            "grads": _differ(on["grads"], off["grads"]),
            "losses": (on["losses"], off["losses"]),
            "values": _differ(on["values"], off["values"]),
            "keys": on["keys"] == off["keys"] == list(titan_model().state_dict()),
            "plain_sd": on["plain_sd"],
            "wrapped": (on["wrapped"], off["wrapped"]),
            "split_ok": on["sent"].split_ok and off["sent"].split_ok,
            "kept": (on["kept"], off["kept"]),
        }  # fmt: skip
        for pass_ in ("forward", "backward"):
            r[pass_] = {
                "mx": on["sent"].mx_weights(pass_),
                "hp": off["sent"].mx_weights(pass_),
                "others equal": on["sent"].others(pass_) == off["sent"].others(pass_),
                "n mx": sum(f.split(".")[-2] in MX_LINEARS for f in on["sent"].bytes[pass_]),
            }
        local_numel = sum(_local(p).numel() for n, p in off["model"].named_parameters()
                          if n.split(".")[-2] in MX_LINEARS)  # fmt: skip
        r["local numel"], r["hp itemsize"] = local_numel, dtype.itemsize
        r["dp"], r["path"] = _dp_rank(mesh)[1], path
        fmt = mx_nn.MXLinearConfig.from_recipe(recipe).weight_fmt
        r["mx per elem"] = (0.5 if get_format(fmt).is_packed else 1) + 1 / 32
        out[name] = r
    return out, model


def refusals(rank: int, world: int) -> dict:
    """parallelize's refusals of fsdp_mx_all_gather, before it changes the model."""
    dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    out = {}
    odd = titan_model()
    odd.layers[1].feed_forward.w1 = nn.Linear(DIM, 96, bias=False)
    before = {k: v.clone() for k, v in odd.state_dict().items()}
    out["rows not whole blocks"] = _error(
        lambda: mx_nn.parallelize(odd, dp, fsdp_mx_all_gather=True)
    )
    out["model untouched"] = all(type(m) is not mx_nn.MXLinear for m in odd.modules()) and all(
        torch.equal(before[k], v) for k, v in odd.state_dict().items()
    )
    out["compile"] = _error(
        lambda: mx_nn.parallelize(titan_model(), dp, compile=True, fsdp_mx_all_gather=True)
    )
    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    out["no dp"] = _error(lambda: mx_nn.parallelize(titan_model(), tp, fsdp_mx_all_gather=True))
    out["no MXLinear"] = _error(
        lambda: mx_nn.parallelize(titan_model(), dp, recipe=None, fsdp_mx_all_gather=True)
    )
    hf = hf_model()
    # transformers 5 renamed gradient_checkpointing_enable (the old name warns).
    getattr(hf, "activation_checkpointing_enable", hf.gradient_checkpointing_enable)()
    out["activation checkpointing"] = _error(
        lambda: mx_nn.parallelize(hf, dp, fsdp_mx_all_gather=True)
    )
    mesh2 = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    plan = {"layers.*.attention.wq": ColwiseParallel()}
    out["explicit plan"] = _error(
        lambda: mx_nn.parallelize(titan_model(), mesh2, plan=plan, fsdp_mx_all_gather=True)
    )
    sharded = nn.Sequential(mx_nn.MXLinear(64, 64, bias=False))
    fully_shard(sharded, mesh=dp)
    out["after fully_shard"] = _error(lambda: enable_fsdp_mx_all_gather(sharded))
    return out


class _Tiny(nn.Module):
    """One MXLinear, optionally checkpointed, optionally read by F.linear as well."""

    def __init__(self, path: str, how: str) -> None:
        super().__init__()
        config = mx_nn.MXLinearConfig.from_recipe("mxfp8", compute_path=path)
        self.lin = mx_nn.MXLinear(64, 128, bias=False, config=config, fqn="lin")
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "checkpoint":
            return checkpoint(self.lin, x, use_reentrant=False)
        if self.how == "F.linear":
            return F.linear(x, self.lin.weight)
        return self.lin(x)


def _runtime_error(dp, path: str, how: str, reshard: bool) -> str:
    model = _Tiny(path, how)
    enable_fsdp_mx_all_gather(model)
    fully_shard(model, mesh=dp, reshard_after_forward=reshard)
    x = torch.randn(4, 64, requires_grad=True)
    try:
        model(x).sum().backward()
    except RuntimeError as e:
        return str(e)
    return "no error"


def runtime_errors(rank: int, world: int) -> dict:
    """A pass that finds the other orientation's cast, or an op other than MXLinear's on
    the gathered weight, raises."""
    dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    out = {}
    for path in ("mx", "fake_quant"):
        out[f"{path}: no re-gather"] = _runtime_error(dp, path, "plain", reshard=False)
        out[f"{path}: checkpoint"] = _runtime_error(dp, path, "checkpoint", reshard=True)
    out["F.linear"] = _runtime_error(dp, "mx", "F.linear", reshard=True)
    out["ok"] = _runtime_error(dp, "mx", "plain", reshard=True)
    return out


def two_rank_suite(rank: int, world: int, cases: list[tuple]) -> dict:
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    results, _ = equivalence(mesh, cases)
    return {
        "equivalence": results,
        "refusals": refusals(rank, world),
        "runtime": runtime_errors(rank, world),
    }


def four_rank_suite(rank: int, world: int, cases: list[tuple], path: str) -> dict:
    """dp=2 x tp=2: the option on against off; then a DCP save of the last case's
    option-on model, loaded into a plain model and into another option-on one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    results, saved = equivalence(mesh, cases)
    sd = get_model_state_dict(saved)
    out = {"equivalence": results}
    out["saved sd plain"] = all(type(_local(v)) is torch.Tensor for v in sd.values())
    dcp.save({"model": sd}, checkpoint_id=path)
    config = mx_nn.MXLinearConfig.from_recipe(cases[-1][4], compute_path=cases[-1][1])
    plain = titan_model(seed=1)  # other weights: the load must replace them
    mx_nn.convert(plain, config, filter_fn=_not_head)
    again = mx_nn.parallelize(titan_model(seed=1), mesh, recipe=config, fsdp_mx_all_gather=True)
    for model in (plain, again):
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
    full = {k: v.full_tensor() for k, v in saved.state_dict().items()}
    out["plain equal"] = [k for k, v in plain.state_dict().items() if not torch.equal(v, full[k])]
    out["plain keys"] = list(plain.state_dict()) == list(full)
    rank_dp, dp = _dp_rank(mesh)
    tokens = _tokens(7).chunk(dp)[rank_dp]
    with torch.no_grad():
        out["reloaded logits"] = torch.equal(logits_of(again, tokens), logits_of(saved, tokens))
    return out
