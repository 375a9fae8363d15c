"""Model families: where each module of the plan (:mod:`mx_nn.plan.llama`, torchtitan 0.3
names) is in a family's own naming, and finding a model's blocks by structure.

==================  =======================  ==========================  ==================
plan key            torchtitan 0.3           Hugging Face Llama          Gemma2/3
==================  =======================  ==========================  ==================
attention_norm      attention_norm           input_layernorm             input_layernorm
attention           attention                self_attn                   self_attn
qkv_linear.wq/k/v   qkv_linear.wq/wk/wv      self_attn.q/k/v_proj        (as Llama)
                    (or one fused ``wqkv``)
attention.wo        attention.wo             self_attn.o_proj            (as Llama)
post_attention_norm --                       --                          post_attention_
                                                                         layernorm
ffn_norm            ffn_norm                 post_attention_layernorm    pre_feedforward_
                                                                         layernorm
feed_forward.w1/3/2 feed_forward.w1/w3/w2    mlp.gate/up/down_proj       (as Llama)
post_ffn_norm       --                       --                          post_feedforward_
                                                                         layernorm
root                tok_embeddings, norm,    embed_tokens, norm, lm_head (as Llama)
                    lm_head
==================  =======================  ==========================  ==================

Phi-3 fuses q/k/v into ``self_attn.qkv_proj`` and gate/up into ``mlp.gate_up_proj``
(GLM the MLP's only); :func:`mx_nn.plan.fused.split_fused` splits them into
``SplitLinear`` modules of their parts first, and these families name the parts
(``self_attn.qkv_proj.q`` ..., ``mlp.gate_up_proj.gate`` / ``.up``).

OLMo2 is Hugging Face Llama without the pre-norms and with Gemma's post-norms, and
normalises its whole query and key projections (``self_attn.q_norm`` / ``k_norm``, the
plan's ``attention.q_norm`` / ``k_norm``: across heads); the torchtitan classic layout
has ``attention.wq`` ... and the head ``output``.

A block of a family is a module with every path of the family's block table, linears
being ``nn.Linear`` subclasses, and no other direct child that holds parameters: a
block with more (extra norms, a parallel branch) is not taken for a family it is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from torch import nn

from mx_nn.plan.fused import SPLITS
from mx_nn.plan.llama import HEAD_NORMS, OPTIONAL

__all__ = ["FAMILIES", "Family", "ModelMap", "find_model_map", "unmapped_message"]

_LINEARS = (
    "attention.qkv_linear.wq",
    "attention.qkv_linear.wk",
    "attention.qkv_linear.wv",
    "attention.wo",
    "feed_forward.w1",
    "feed_forward.w3",
    "feed_forward.w2",
)
_COLWISE = frozenset(_LINEARS) - {"attention.wo", "feed_forward.w2"}
_MERGED = "merged"  # a plan key whose module a fused linear of the family replaces


@dataclass(frozen=True, kw_only=True)
class Family:
    """One family's naming of the plan's modules."""

    name: str
    """Human name, used in messages."""
    block: Mapping[str, str | None] = field(default_factory=dict)
    """Plan key -> path in this family's block; a key not listed keeps its name; None:
    the family has no such module; ``"merged"``: a fused linear of it replaces it."""
    root: Mapping[str, str] = field(default_factory=dict)
    """Root plan key -> last path component of that module in this family."""
    attention_input: str | int = 1
    """How a block passes the hidden states to attention: a keyword name, or the number
    of positional arguments (the hidden states first)."""
    split: bool = False
    """Its blocks exist only once :func:`mx_nn.plan.fused.split_fused` has split the
    model's fused projections (its paths name the parts)."""

    def path(self, key: str) -> str | None:
        """This family's path of a block plan key (None: absent or merged away)."""
        p = self.block.get(key, key)
        return None if p in (None, _MERGED) else p

    def root_name(self, key: str) -> str:
        return self.root.get(key, key)

    def linears(self) -> tuple[str, ...]:
        """The block's linear paths, in forward order (a fused one once)."""
        out = []
        for key in _LINEARS:
            p = self.path(key)
            if p is not None and p not in out:
                out.append(p)
        return tuple(out)

    def colwise(self) -> tuple[str, ...]:
        """The block's columnwise linears' paths (split along out_features)."""
        return tuple(p for p in self.linears() if p in {self.path(k) for k in _COLWISE})

    def head_norms(self) -> tuple[tuple[str, str], ...]:
        """(norm path, path of the projection it normalises) of the family's norms over
        all heads of a projection (:data:`mx_nn.plan.llama.HEAD_NORMS`)."""
        pairs = ((self.path(n), self.path(p)) for n, p in HEAD_NORMS.items())
        return tuple((n, p) for n, p in pairs if n is not None and p is not None)

    def required(self) -> tuple[str, ...]:
        """Paths a block must have: every planned module but the optional norms."""
        keys = [*_LINEARS, "attention", "feed_forward", *OPTIONAL]
        paths = [self.path(k) for k in keys]
        return tuple(dict.fromkeys(p for p in paths if p is not None))


def _hf(name: str, changes: Mapping[str, str | None] | None = None, split: bool = False) -> Family:
    """A Hugging Face family: Llama's names, with ``changes`` (plan key -> path)."""
    block = {
        "attention_norm": "input_layernorm",
        "attention": "self_attn",
        "attention.qkv_linear.wq": "self_attn.q_proj",
        "attention.qkv_linear.wk": "self_attn.k_proj",
        "attention.qkv_linear.wv": "self_attn.v_proj",
        "attention.wo": "self_attn.o_proj",
        "post_attention_norm": None,
        "ffn_norm": "post_attention_layernorm",
        "feed_forward": "mlp",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
        "post_ffn_norm": None,
        "attention.q_norm": None,  # per-head norms (Qwen3's) need no style: left unplanned
        "attention.k_norm": None,
        **(changes or {}),
    }
    root = {"tok_embeddings": "embed_tokens", "norm": "norm", "lm_head": "lm_head"}
    return Family(name=name, block=MappingProxyType(block), root=MappingProxyType(root),
                  attention_input="hidden_states", split=split)  # fmt: skip


_TITAN_ROOT = MappingProxyType({"tok_embeddings": "tok_embeddings", "norm": "norm"})
_NO_POST = {"post_attention_norm": None, "post_ffn_norm": None, "attention.q_norm": None,
            "attention.k_norm": None}  # fmt: skip

FAMILIES: tuple[Family, ...] = (
    _hf(  # Gemma2, Gemma3: four norms around attention and the MLP
        "Hugging Face Gemma2/3",
        {
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffn_norm": "post_feedforward_layernorm",
        },
    ),
    _hf(  # OLMo2: the norms after attention and the MLP only; q and k across heads
        "Hugging Face OLMo2",
        {
            "attention_norm": None,
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": None,
            "post_ffn_norm": "post_feedforward_layernorm",
            "attention.q_norm": "self_attn.q_norm",
            "attention.k_norm": "self_attn.k_norm",
        },
    ),
    _hf(  # Phi-3: fused qkv_proj and gate_up_proj, split into their parts (plan.fused)
        "Hugging Face Phi-3 (qkv_proj, gate_up_proj split)",
        {
            "attention.qkv_linear.wq": "self_attn.qkv_proj.q",
            "attention.qkv_linear.wk": "self_attn.qkv_proj.k",
            "attention.qkv_linear.wv": "self_attn.qkv_proj.v",
            "feed_forward.w1": "mlp.gate_up_proj.gate",
            "feed_forward.w3": "mlp.gate_up_proj.up",
        },
        split=True,
    ),
    _hf(  # GLM: Llama's attention, Phi-3's fused gate_up_proj (split)
        "Hugging Face GLM (gate_up_proj split)",
        {"feed_forward.w1": "mlp.gate_up_proj.gate", "feed_forward.w3": "mlp.gate_up_proj.up"},
        split=True,
    ),
    _hf("Hugging Face Llama"),  # Llama, Mistral, Qwen2/3 and the other Llama-likes
    Family(
        name="torchtitan Llama3 (fused wqkv)",
        block=MappingProxyType(
            {
                "attention.qkv_linear.wq": "attention.qkv_linear.wqkv",
                "attention.qkv_linear.wk": _MERGED,
                "attention.qkv_linear.wv": _MERGED,
                **_NO_POST,
            }
        ),  # fmt: skip
        root=_TITAN_ROOT,
        attention_input=3,  # (x, attention_masks, positions)
    ),
    Family(
        name="torchtitan Llama3",
        block=MappingProxyType(_NO_POST),
        root=_TITAN_ROOT,
        attention_input=3,
    ),
    Family(
        name="torchtitan Llama (classic)",
        block=MappingProxyType(
            {
                **{f"attention.qkv_linear.w{p}": f"attention.w{p}" for p in "qkv"},
                **_NO_POST,
            }
        ),  # fmt: skip
        root=MappingProxyType({**_TITAN_ROOT, "lm_head": "output"}),
        attention_input=2,  # (x, freqs_cis)
    ),
)
"""Families, most specific first (the first whose blocks a model has is used)."""


@dataclass(frozen=True)
class ModelMap:
    """Where a model's parts are: block fqns in order and the root modules (or None)."""

    family: Family
    blocks: tuple[str, ...]
    embedding: str | None
    norm: str | None
    head: str | None


def _get(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _holds_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _is_block(module: nn.Module, family: Family) -> bool:
    if any(not isinstance(_get(module, p), nn.Linear) for p in family.linears()):
        return False
    if any(_get(module, p) is None for p in family.required()):
        return False
    tops = {p.split(".", 1)[0] for p in family.required()}
    return all(n in tops or not _holds_parameters(c) for n, c in module.named_children())


def find_model_map(model: nn.Module) -> ModelMap | None:
    """Map ``model`` onto the first family whose decoder blocks occur in it.

    Blocks are found by structure wherever they are; the embedding, final norm and head
    are the modules outside every block whose last path component is the family's name.

    Args:
        model: any module (a Hugging Face or torchtitan model, or one holding such).
    Returns:
        The :class:`ModelMap` (blocks in ``named_modules`` order; a root module it lacks
        None), or None where no family's blocks occur.
    """
    for family in FAMILIES:
        blocks = [fqn for fqn, m in model.named_modules() if fqn and _is_block(m, family)]
        if not blocks:
            continue
        inside = tuple(f"{b}." for b in blocks)

        def outside(key: str, kind: type, inside=inside, family=family) -> str | None:
            leaf = family.root_name(key)
            for fqn, m in model.named_modules():
                if fqn.rsplit(".", 1)[-1] == leaf and not fqn.startswith(inside):
                    if isinstance(m, kind):
                        return fqn
            return None

        return ModelMap(
            family=family,
            blocks=tuple(blocks),
            embedding=outside("tok_embeddings", nn.Embedding),
            norm=outside("norm", nn.Module),
            head=outside("lm_head", nn.Linear),
        )
    return None


def unmapped_message(model: nn.Module) -> str:
    """Why ``parallelize`` cannot map ``model``.

    Args:
        model: a model :func:`find_model_map` found no family in.
    Returns:
        The message: its linears (the first 24), what each family expects, for blocks
        that nearly match a family what they lack and have besides, a hint for fused
        projections, and ``plan=`` as the way out.
    """
    linears = [fqn for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]
    shown = ", ".join(linears[:24]) + (
        f", ... ({len(linears)} in all)" if len(linears) > 24 else ""
    )
    near = []
    for family in (f for f in FAMILIES if not f.split):  # fused ones: the hint below
        tops = {p.split(".", 1)[0] for p in family.required()}
        for fqn, m in model.named_modules():
            has = [p for p in family.required() if _get(m, p) is not None]
            if fqn and tops <= {n for n, _ in m.named_children()} and has:
                extra = [n for n, c in m.named_children() if n not in tops and _holds_parameters(c)]
                missing = [p for p in family.required() if _get(m, p) is None]
                near.append(
                    f"{fqn} is not a {family.name} block (missing {missing or 'nothing'}, "
                    f"besides {extra or 'nothing'})"
                )
                break
    fused = [f for f in linears if f.rsplit(".", 1)[-1] in ("qkv_proj", "gate_up_proj")]
    hint = (
        f" Fused projections concatenated as [q; k; v] or [gate; up] ({fused[0]}) are "
        f"planned once split into their parts, for the attention and MLP classes whose "
        f"forward is known to slice them ({', '.join(SPLITS)}; parallelize splits them, "
        f"apply_tp needs mx_nn.plan.fused.split_fused(model) first); a columnwise split "
        f"of the fused weight would give each rank a slice of the concatenation, not its "
        f"own heads."
        if fused
        else ""
    )
    expected = "; ".join(f"{f.name}: {', '.join(f.required())}" for f in FAMILIES if not f.split)
    expected += f"; and {', '.join(f.name for f in FAMILIES if f.split)} once split"
    return (
        f"parallelize cannot map {type(model).__name__}: found the linears [{shown or 'none'}]"
        f"{'; ' + '; '.join(near) if near else ''}.{hint} Expected decoder blocks of one of "
        f"these families ({expected}). Pass plan= (fqn pattern -> ParallelStyle) for "
        f"other models."
    )
