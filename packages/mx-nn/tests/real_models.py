"""Tiny random models of the installed torchtitan and transformers, and the check that
test_real_models.py runs on spawned gloo ranks (importable by them by name)."""

from __future__ import annotations

import copy

import torch
from parallel_models import loss_of, rel_err
from torch import nn

import mx_nn

# Whole MX blocks per rank up to tp=4 (k: 4 heads x 32 = 128 rows, 32 per rank).
VOCAB, DIM, HEADS, KV_HEADS, FFN, LAYERS = 256, 256, 8, 4, 512, 2
BATCH, SEQ = 2, 16


def titan_llama3(fuse_qkv: bool) -> nn.Module:
    """torchtitan 0.3's own Llama3Model (its block, attention, qkv_linear, Linear classes).

    Its language models use flex or varlen attention, which have no CPU backward; the
    inner attention is torchtitan's own ScaledDotProductAttention (causal) instead, which
    leaves every module the plan touches as torchtitan builds it."""
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config

    layers = [
        llama3.Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
            attention=make_gqa_config(
                dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, fuse_qkv=fuse_qkv,
                wqkv_param_init=llama3._LINEAR_INIT, wo_param_init=llama3._depth_init(i),
                inner_attention=ScaledDotProductAttention.Config(),
                rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=64, theta=500000),
            ),
            feed_forward=make_ffn_config(dim=DIM, hidden_dim=FFN,
                                         w1_param_init=llama3._LINEAR_INIT,
                                         w2w3_param_init=llama3._depth_init(i)),
        )
        for i in range(LAYERS)
    ]  # fmt: skip
    config = llama3.Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM,
                                        param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB,
                              param_init=llama3._output_linear_init(DIM)),
    )  # fmt: skip
    model = config.build()
    model.init_weights()
    return model


def hf(family: str, **overrides) -> nn.Module:
    """A tiny random Hugging Face causal LM of ``family`` with its default tying (the
    tiny sizes, or ``overrides``)."""
    import transformers

    cls = {"gemma": "Gemma", "gemma2": "Gemma2", "qwen3": "Qwen3", "olmo2": "Olmo2",
           "mistral": "Mistral", "llama": "Llama", "phi3": "Phi3"}[family]  # fmt: skip
    sizes = dict(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS,
        max_position_embeddings=64,
    )  # fmt: skip
    config = getattr(transformers, f"{cls}Config")(**{**sizes, **overrides})
    config._attn_implementation = "eager"
    return getattr(transformers, f"{cls}ForCausalLM")(config)


BUILDERS = {
    "torchtitan Llama3 (fused wqkv)": lambda: titan_llama3(True),
    "torchtitan Llama3 (wq, wk, wv)": lambda: titan_llama3(False),
    "Gemma (tied)": lambda: hf("gemma"),
    "Gemma2": lambda: hf("gemma2"),
    "Qwen3": lambda: hf("qwen3"),
    "OLMo2": lambda: hf("olmo2"),
    "Phi-3": lambda: hf("phi3", pad_token_id=0),  # fused qkv_proj and gate_up_proj
}


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    return out if isinstance(out, torch.Tensor) else out.logits


def _tie(model: nn.Module) -> tuple[int, bool]:
    """(elements of the model's distinct parameters, whether its LM head is tied to its
    embedding): a parameter duplicated or lost changes the first (elements, not tensors:
    split fused projections hold the same elements in more tensors)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = emb is not None and head is not None and head.weight is emb.weight
    return sum(p.numel() for p in model.parameters()), tied


def check(
    rank: int,
    world: int,
    names: list[str],
    recipe: str | None,
    shape=None,
    dims=None,
    sequence_parallel: bool = True,
) -> dict:
    """Per model: parallelize on a mesh of ``shape`` (default: tp=world), with SP unless
    ``sequence_parallel`` is False; logits' error against one process, the losses of two
    SGD steps of both, the parameter count and tie before and after; or the refusal
    text."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", shape or (world,), mesh_dim_names=dims)
    out = {}
    for name in names:
        torch.manual_seed(0)
        ref = BUILDERS[name]()
        before = _tie(ref)
        try:
            par = mx_nn.parallelize(
                copy.deepcopy(ref), mesh, recipe=recipe, sequence_parallel=sequence_parallel
            )
        except ValueError as e:
            out[name] = {"refused": str(e)}
            continue
        if recipe is not None:
            mx_nn.convert(ref, recipe, filter_fn=lambda _m, f: f not in ("lm_head", "output"))
        with torch.no_grad():
            logits = rel_err(_logits(par, _tokens(0)), _logits(ref, _tokens(0)))
        losses = {"ref": [], "par": []}
        for key, model in (("ref", ref), ("par", par)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(2):
                opt.zero_grad()
                loss = loss_of(model, _tokens(step + 1))
                loss.backward()
                opt.step()
                losses[key].append(loss.item())
        out[name] = {"logits": logits, "losses": losses, "tie": (before, _tie(par))}
    return out


# The model zoo (test_model_zoo.py): every Llama-like family of the installed transformers.


def _snapshot(model: nn.Module) -> tuple:
    tensors = {n: t.detach().clone() for n, t in model.state_dict(keep_vars=True).items()}
    kinds = [(n, type(m).__name__) for n, m in model.named_modules()]
    return tensors, kinds, [id(p) for p in model.parameters()]


def _changes(model: nn.Module, before: tuple) -> list[str]:
    tensors, kinds, ids = before
    now = _snapshot(model)
    out = []
    for n, t in tensors.items():
        u = now[0].get(n)
        if u is None or type(u) is not type(t) or not torch.equal(u, t):
            out.append(f"{n} changed")
    if now[1] != kinds:
        out.append("module types changed")
    if now[2] != ids:
        out.append("parameters replaced")
    return out


def refusal_changes(model_type: str, mesh) -> list[str]:
    """What a refused ``parallelize`` left changed on a fresh tiny ``model_type`` model of
    model_zoo.py (empty: nothing, and a second call gives the same refusal, not "already
    ran")."""
    import model_zoo

    torch.manual_seed(0)
    model = model_zoo.build(model_type)
    before = _snapshot(model)
    messages = []
    for _ in range(2):
        try:
            mx_nn.parallelize(model, mesh, recipe=None)
        except ValueError as e:
            messages.append(str(e))
        else:
            return ["parallelize did not refuse on the fresh model"]
    out = _changes(model, before)
    if messages[1] != messages[0]:
        out.append(f"a second call said: {messages[1][:200]}")
    return out


def zoo_check(rank: int, world: int, model_types: list[str]) -> dict[str, dict]:
    """:func:`check` (recipe None, tp=world with SP) of each model type of model_zoo.py,
    on spawned ranks; a crash is recorded as ``{"crashed": traceback}`` rather than
    ending the run, and a refusal gets ``"changes"``: what it left changed
    (:func:`refusal_changes`)."""
    import functools
    import traceback

    import model_zoo
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for t in model_types:
        name = f"zoo: {t}"
        BUILDERS.setdefault(name, functools.partial(model_zoo.build, t))
        try:
            res = check(rank, world, [name], None)[name]
        except Exception:
            res = {"crashed": traceback.format_exc()}
        if "refused" in res:
            try:
                res["changes"] = refusal_changes(t, mesh)
            except Exception:
                res["changes"] = [traceback.format_exc()]
        out[t] = res
    return out


def tied_check(rank: int, world: int, recipe: str | None) -> dict:
    """Gemma (its LM head tied to its embedding) parallelized on a ("dp", "tp") = (2, 2)
    mesh, trained two AdamW steps against one process: the losses, and whether the tie
    is one Parameter with one gradient and one optimizer state."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = BUILDERS["Gemma (tied)"]()
    par = mx_nn.parallelize(copy.deepcopy(ref), mesh, recipe=recipe)
    if recipe is not None:
        mx_nn.convert(ref, recipe, filter_fn=lambda _m, f: f != "lm_head")
    head, emb = par.get_output_embeddings(), par.get_input_embeddings()
    losses: dict[str, list[float]] = {"ref": [], "par": []}
    out: dict = {"losses": losses, "ref parameters": len(list(ref.parameters()))}
    for key, model in (("ref", ref), ("par", par)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(2):
            opt.zero_grad()
            loss = loss_of(model, _tokens(step + 1))
            loss.backward()
            opt.step()
            losses[key].append(loss.item())
        if key == "par":
            named = [
                n for n, p in model.named_parameters(remove_duplicate=False) if p is emb.weight
            ]
            out["names of the tied Parameter"] = sorted(named)
            out["tied"] = head.weight is emb.weight
            out["placements"] = str(emb.weight.placements)
            out["grad"] = emb.weight.grad is not None and head.weight.grad is emb.weight.grad
            out["states"] = len(opt.state)
            out["parameters"] = len(list(model.parameters()))
            out["tied state"] = emb.weight in opt.state
    return out
