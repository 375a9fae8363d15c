"""Checks run inside spawned gloo groups by test_parallelize.py (importable by the
spawned ranks, which a test module under --import-mode=importlib is not)."""

from __future__ import annotations

import copy
import logging

import torch
import torch.distributed as dist
from parallel_models import (
    DIM,
    HEADS,
    VOCAB,
    TitanEmbedRenamed,
    full,
    hf_model,
    logits_of,
    loss_of,
    project_model,
    rel_err,
    titan_model,
)
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils._python_dispatch import TorchDispatchMode

import mx_nn


class CommCounter(TorchDispatchMode):
    """Counts the functional collectives run under it, by op name (CommDebugMode's module
    tracking fails inside transformers' hooked forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.sent: list[tuple[str, torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "_c10d_functional" and func.__name__.startswith(_COLLECTIVES):
            name = func.__name__.split(".")[0]
            self.counts[name] = self.counts.get(name, 0) + 1
            self.sent.append((name, args[0].dtype, args[0].nbytes))
        return func(*args, **(kwargs or {}))


_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
MODELS = {"titan": titan_model, "hf": hf_model, "llama": project_model}
BATCH, SEQ, STEPS = 2, 64, 5


def _tokens(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _dp(mesh):
    """(this rank's dp index, dp size, dp process group or None)."""
    if "dp" not in (mesh.mesh_dim_names or ()):
        return 0, 1, None
    dp = mesh["dp"] if mesh.ndim == 2 else mesh
    return dp.get_local_rank(), dp.size(), dp.get_group()


def _not_head(_module, fqn: str) -> bool:
    return fqn not in ("output", "lm_head")


def equivalence(rank: int, world: int, cases: list[tuple]) -> dict:
    """Per case (name, model, mesh shape, mesh names, recipe, parallelize kwargs):
    errors of logits and grads against the same model on this process alone, and the
    losses of STEPS SGD steps of both."""
    out = {}
    for name, kind, shape, names, recipe, kwargs in cases:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        ref = MODELS[kind]()
        if recipe is not None:
            mx_nn.convert(ref, recipe, filter_fn=_not_head)
        par = mx_nn.parallelize(copy.deepcopy(ref), mesh, recipe=recipe, **kwargs)
        dp_rank, dp, dp_group = _dp(mesh)
        tokens = _tokens(0)
        local = tokens.chunk(dp)[dp_rank]
        with torch.no_grad(), CommCounter() as comm:
            logits = rel_err(logits_of(par, local), logits_of(ref, tokens).chunk(dp)[dp_rank])
        loss_of(ref, tokens).backward()
        loss_of(par, local).backward()
        pars = dict(par.named_parameters())
        grads = {n: rel_err(pars[n].grad, p.grad) for n, p in ref.named_parameters()}
        noise = {}
        if recipe is not None:  # how far MX itself moves each gradient from high precision
            hp = MODELS[kind]()
            loss_of(hp, tokens).backward()
            hp_grads = dict(hp.named_parameters())
            noise = {n: rel_err(p.grad, hp_grads[n].grad) for n, p in ref.named_parameters()}
        exact = all(torch.equal(full(pars[n].grad), p.grad) for n, p in ref.named_parameters())
        losses = {"ref": [], "par": []}
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in (("ref", ref), ("par", par))}
        for step in range(STEPS):
            tokens = _tokens(step + 1)
            for key, model, batch in (
                ("ref", ref, tokens),
                ("par", par, tokens.chunk(dp)[dp_rank]),
            ):
                opts[key].zero_grad()
                loss = loss_of(model, batch)
                loss.backward()
                opts[key].step()
                value = loss.detach().clone()
                if key == "par" and dp > 1:
                    dist.all_reduce(value, group=dp_group)
                    value /= dp
                losses[key].append(value.item())
        out[name] = {
            "comms": comm.counts,
            "logits": logits,
            "grads": grads,
            "mx_noise": noise,
            "grads_exact": exact,
            "losses": losses,
            "keys_kept": list(par.state_dict()) == list(ref.state_dict()),
        }
    return out


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _error(fn) -> str:
    """The message of the exception ``fn()`` raises, prefixed by its type."""
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def bad_inputs(rank: int, world: int) -> dict:
    """Every input parallelize refuses, each with its message; and the model untouched
    when it refuses."""
    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    out = {}
    out["2-D mesh named (a, b)"] = _error(
        lambda: mx_nn.parallelize(
            titan_model(), init_device_mesh("cpu", (1, world), mesh_dim_names=("a", "b"))
        )
    )
    out["3-D mesh"] = _error(
        lambda: mx_nn.parallelize(titan_model(), init_device_mesh("cpu", (1, 1, world)))
    )
    out["mesh not a DeviceMesh"] = _error(lambda: mx_nn.parallelize(titan_model(), "tp"))
    out["recipe not a recipe"] = _error(lambda: mx_nn.parallelize(titan_model(), tp, recipe=8))
    out["unknown recipe"] = _error(lambda: mx_nn.parallelize(titan_model(), tp, recipe="mxfp9"))
    seq = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    out["unmappable model"] = _error(lambda: mx_nn.parallelize(seq, tp))
    out["plan key matching nothing"] = _error(
        lambda: mx_nn.parallelize(
            seq, tp, plan={"0": ColwiseParallel(), "layers.*.wq": ColwiseParallel()}
        )
    )
    out["plan value not a style"] = _error(
        lambda: mx_nn.parallelize(seq, tp, plan={"0": "colwise"})
    )
    one_kv = titan_model()
    for layer in one_kv.layers:
        layer.attention.wk = nn.Linear(DIM, DIM // HEADS, bias=False)
        layer.attention.n_kv_heads = 1
    out["kv heads not divisible"] = _error(lambda: mx_nn.parallelize(one_kv, tp))
    odd_ffn = titan_model()
    odd_ffn.layers[1].feed_forward.w1 = nn.Linear(DIM, 96, bias=False)
    before = {n: p.clone() for n, p in odd_ffn.state_dict().items()}
    out["MX shard not whole blocks"] = _error(lambda: mx_nn.parallelize(odd_ffn, tp))
    out["model untouched after refusal"] = all(
        type(m) is not mx_nn.MXLinear for m in odd_ffn.modules()
    ) and all(torch.equal(before[n], p) for n, p in odd_ffn.state_dict().items())
    odd_vocab = titan_model()
    odd_vocab.tok_embeddings = nn.Embedding(VOCAB - 1, DIM)
    out["vocab not divisible"] = _error(lambda: mx_nn.parallelize(odd_vocab, tp, recipe=None))
    model = mx_nn.parallelize(titan_model(), tp, recipe=None)
    out["sequence not divisible"] = _error(lambda: model(torch.zeros(1, 63, dtype=torch.long)))
    return out


def fallbacks_and_options(rank: int, world: int) -> dict:
    """Sequence parallelism that cannot apply is logged and TP runs without it; an
    explicit plan; mx_lm_head; compile=True; what each logs."""
    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    records = _Records()
    logger = logging.getLogger("mx_nn")
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    out = {}
    tokens = _tokens(0)
    torch.manual_seed(0)
    ref = TitanEmbedRenamed()
    par = mx_nn.parallelize(copy.deepcopy(ref), tp, recipe=None)
    out["no embedding: logits"] = rel_err(logits_of(par, tokens), logits_of(ref, tokens))
    out["no embedding: norms replicated"] = not isinstance(
        par.layers[0].attention_norm.weight, DTensor
    )
    ref = titan_model()
    plan = {
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w3": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(),
    }
    par = mx_nn.parallelize(copy.deepcopy(ref), tp, recipe=None, plan=plan)
    out["explicit plan: logits"] = rel_err(logits_of(par, tokens), logits_of(ref, tokens))
    out["explicit plan: only its modules"] = isinstance(
        par.layers[1].feed_forward.w2.weight, DTensor
    ) and not isinstance(par.layers[1].attention.wq.weight, DTensor)
    par = mx_nn.parallelize(
        titan_model(),
        tp,
        recipe="mxfp8",
        mx_lm_head=True,
        sequence_parallel=False,
        plan={"output": ColwiseParallel(output_layouts=Replicate())},
    )
    out["mx_lm_head converts the head"] = isinstance(par.output, mx_nn.MXLinear)
    par = mx_nn.parallelize(titan_model(), tp, recipe="mxfp8", plan={"output": ColwiseParallel()})
    out["head stays high precision"] = type(par.output) is nn.Linear and isinstance(
        par.layers[0].attention.wq, mx_nn.MXLinear
    )
    # Compiled against eager, both tensor-parallel mxfp8 with MX gathers.
    eager = mx_nn.parallelize(titan_model(), tp, recipe="mxfp8")
    par = mx_nn.parallelize(titan_model(), tp, recipe="mxfp8", compile=True)
    losses = []
    for model in (par, eager):
        loss = loss_of(model, tokens)
        loss.backward()
        losses.append(loss)
    out["compile: loss"] = rel_err(losses[0], losses[1])
    grads = dict(eager.named_parameters())
    out["compile: grads"] = {n: rel_err(p.grad, grads[n].grad) for n, p in par.named_parameters()}
    out["compile: blocks compiled"] = all(
        layer._compiled_call_impl is not None for layer in par.layers
    )
    logger.removeHandler(records)
    out["log"] = records.messages
    return out


def _train_step(model, opt, tokens) -> float:
    opt.zero_grad()
    loss = loss_of(model, tokens)
    loss.backward()
    opt.step()
    return loss.item()


def checkpoints(rank: int, world: int, kind: str, path: str, recipe: str | None = None) -> dict:
    """Save a tp=2 model and its AdamW state with torch.distributed.checkpoint; load it at
    tp=4, tp=1 and into a plain model; the next two steps' losses of each (the second
    one shows the optimizer state came back) against the tp=2 run's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    def state(model, opt):
        return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}

    def next_two(model, opt):
        return [_train_step(model, opt, _tokens(s)) for s in (98, 99)]

    tp2 = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("rep", "tp"))["tp"]
    saved = mx_nn.parallelize(MODELS[kind](), tp2, recipe=recipe)
    opt = torch.optim.AdamW(saved.parameters(), lr=1e-3)
    _train_step(saved, opt, _tokens(97))
    dcp.save(state(saved, opt), checkpoint_id=path)
    out = {"keys": list(get_model_state_dict(saved)) == list(MODELS[kind]().state_dict())}
    out["tp=2 (saved run)"] = next_two(saved, opt)
    tp1 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("rep", "tp"))["tp"]
    tp4 = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    for name, mesh in (("tp=4", tp4), ("tp=1", tp1), ("plain", None)):
        model = MODELS[kind](seed=1)  # different weights: the load must replace them
        if mesh is not None:
            mx_nn.parallelize(model, mesh, recipe=recipe)
        elif recipe is not None:
            mx_nn.convert(model, recipe, filter_fn=_not_head)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sd = state(model, opt)
        dcp.load(sd, checkpoint_id=path)
        set_model_state_dict(model, sd["model"])
        set_optimizer_state_dict(model, opt, sd["optim"])
        out[name] = next_two(model, opt)
    return out


def mx_comms(rank: int, world: int) -> dict:
    """A bf16 transformers Llama at tp=2 with mxfp8: the MX sequence-parallel gathers
    against high-precision ones: logits, gradients, and the bytes each collective sends,
    forward and backward."""
    out = {}
    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    tokens = _tokens(0)
    for mx in (False, True):
        model = mx_nn.parallelize(hf_model().to(torch.bfloat16), tp, mx_comms=mx)
        with CommCounter() as fwd:
            loss = loss_of(model, tokens)
        with CommCounter() as bwd:
            loss.backward()
        grads = {n: full(p.grad).float() for n, p in model.named_parameters()}
        out[mx] = {"loss": loss.item(), "fwd": fwd.sent, "bwd": bwd.sent, "grads": grads}
    out["logits exact"] = out[True]["loss"] == out[False]["loss"]
    # An fp32 model under bf16 autocast: the gather casts what the linears would cast.
    autocast = []
    for mx in (False, True):
        model = mx_nn.parallelize(project_model(), tp, mx_comms=mx)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            autocast.append(logits_of(model, tokens))
    out["autocast logits exact"] = torch.equal(autocast[0], autocast[1])
    out["grads"] = {n: rel_err(g, out[False]["grads"][n]) for n, g in out[True]["grads"].items()}
    for mx in (False, True):
        del out[mx]["grads"]
    return out


def two_rank_suite(rank: int, world: int, cases: list[tuple]) -> dict:
    """equivalence, bad_inputs and fallbacks_and_options in one process group."""
    return {
        "equivalence": equivalence(rank, world, cases),
        "errors": bad_inputs(rank, world),
        "options": fallbacks_and_options(rank, world),
        "mx_comms": mx_comms(rank, world),
    }


def four_rank_suite(rank: int, world: int, cases: list[tuple], path: str) -> dict:
    """equivalence, then checkpoints of the project's and the transformers model."""
    out = {"equivalence": equivalence(rank, world, cases)}
    for kind, recipe in (("llama", "mxfp8"), ("hf", None)):
        out[kind] = checkpoints(rank, world, kind, f"{path}/{kind}", recipe)
    return out
