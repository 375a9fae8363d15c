"""The decoder families of the installed transformers that look like Llama (attention
with q/k/v/o projections and a gated MLP), as tiny random models, and the table of
test_model_zoo.py's results in docs/parallelism.md (the check its spawned ranks run:
real_models.zoo_check).

Every model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` is surveyed, in sorted order:

- an alias (a model type whose config class belongs to another type with the same
  model class, as gpt-sw3 of gpt2) is left out for that type;
- multimodal: the type is in one of transformers' image, audio or multimodal task
  mappings, or its config has a vision, audio or image sub-config;
- encoder-decoder: the type is in a sequence-to-sequence mapping, its tiny config says
  ``is_encoder_decoder``, or its config is composed of encoder and decoder sub-configs;
- skipped: its config or model cannot be built at the tiny sizes (the error says why);
- mixture of experts: its tiny config asks for experts (an expert count above 0, or a
  MoE switch on), or one that cannot be built has such defaults, or the model holds
  expert, router or MoE modules;
- kept: some module holds an attention child with ``q_proj``, ``k_proj``, ``v_proj``
  and ``o_proj`` (or a fused ``qkv_proj`` and ``o_proj``) and an MLP child with
  ``gate_proj``, ``up_proj`` and ``down_proj`` (or a fused ``gate_up_proj`` and
  ``down_proj``); the others have no such decoder layer.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import textwrap
import warnings
from pathlib import Path

import torch
from torch import nn

VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, POSITIONS = 256, 256, 8, 4, 32, 512, 2, 64
SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": DIM,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "intermediate_size": FFN,
    "num_hidden_layers": LAYERS,
    "max_position_embeddings": POSITIONS,
}
# Sizes a config must keep (it may derive others, as an MLA head_dim, from its own).
_READ_BACK = ("vocab_size", "hidden_size", "num_hidden_layers")

_MULTIMODAL_MAPS = ("IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM", "VISION_2_SEQ", "IMAGE",
                    "TEXT_TO_WAVEFORM", "TEXT_TO_SPECTROGRAM", "SPEECH_SEQ_2_SEQ", "CTC",
                    "AUDIO_CLASSIFICATION")  # fmt: skip
_SEQ2SEQ_MAPS = ("SEQ_TO_SEQ_CAUSAL_LM", "SPEECH_SEQ_2_SEQ")
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_MOE_SWITCHES = ("is_moe", "enable_moe_block")
_MOE_MODULE = re.compile("expert|moe|router|topkgating", re.IGNORECASE)
_ATTENTION = ({"q_proj", "k_proj", "v_proj", "o_proj"}, {"qkv_proj", "o_proj"})
_MLP = ({"gate_proj", "up_proj", "down_proj"}, {"gate_up_proj", "down_proj"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """One model type of the causal-LM mapping and what the survey made of it."""

    model_type: str
    model_class: str
    verdict: str
    """"kept", "alias", "multimodal", "encoder-decoder", "MoE", "skipped" or "other"."""
    reason: str = ""


def _maps(kind: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, f"MODEL_FOR_{kind}_MAPPING_NAMES", {})


def _config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def _defaults(config_class) -> dict[str, object]:
    """The config class's keyword defaults (its dataclass fields or ``__init__``'s)."""
    if dataclasses.is_dataclass(config_class):
        return {f.name: f.default for f in dataclasses.fields(config_class)}
    params = inspect.signature(config_class.__init__).parameters.values()
    return {p.name: p.default for p in params}


def tiny_config(model_type: str):
    """The tiny config of ``model_type``: :data:`SIZES`, eager attention, the family's
    own default tying; a default pad token outside the tiny vocabulary becomes 0 and
    every dropout probability 0.

    Raises:
        Exception: whatever the config class raises; ValueError when it does not keep
            one of the sizes.
    """
    import transformers

    transformers.logging.set_verbosity_error()  # the tiny vocabulary's token-id warnings
    config_class = _config_class(model_type)
    sizes = dict(SIZES)
    if isinstance(getattr(config_class, "head_dim", None), property):
        del sizes["head_dim"]  # derived (hidden / heads = HEAD_DIM), not settable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = config_class(**sizes)
    for name in _READ_BACK:
        got = getattr(config, name, SIZES[name])
        if got != SIZES[name]:
            raise ValueError(f"the config keeps {name}={got!r}, not {SIZES[name]!r}")
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and not 0 <= pad < VOCAB:
        config.pad_token_id = 0
    for name, p in config.to_dict().items():
        # Both runs must compute the same function: a model built in training mode
        # drops out at random (Seed-OSS's attention and residual dropouts default to 0.1).
        if "dropout" in name and isinstance(p, float) and p > 0:
            setattr(config, name, 0.0)
    config._attn_implementation = "eager"
    return config


def _model_class(model_type: str) -> type[nn.Module]:
    import transformers

    return getattr(transformers, _maps("CAUSAL_LM")[model_type])


def build(model_type: str, device: str | torch.device = "cpu") -> nn.Module:
    """A tiny random causal LM of ``model_type`` (:func:`tiny_config`) on ``device``."""
    config = tiny_config(model_type)
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _model_class(model_type)(config)


def _has(module: nn.Module, names: set[str]) -> bool:
    children = dict(module.named_children())
    return all(getattr(children.get(n), "weight", None) is not None for n in names)


def decoder_layers(model: nn.Module) -> list[str]:
    """Fqns of the modules with a q/k/v/o attention child and a gated MLP child."""
    out = []
    for fqn, m in model.named_modules():
        kids = list(m.children())
        attn = any(_has(c, s) for c in kids for s in _ATTENTION)
        if attn and any(_has(c, s) for c in kids for s in _MLP):
            out.append(fqn)
    return out


def _moe(values: dict[str, object]) -> str | None:
    """The first expert count above 0 or MoE switch on among ``values``, or None."""
    for name in _EXPERT_COUNTS:
        n = values.get(name)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return f"{name}={n}"
    on = [name for name in _MOE_SWITCHES if values.get(name) is True]
    return f"{on[0]}=True" if on else None


def _error(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:160]}{'...' if len(text) > 160 else ''}"


def classify(model_type: str) -> Family:
    """What the survey makes of one model type (the module docstring's rules)."""
    model_class = _maps("CAUSAL_LM")[model_type]

    def verdict(kind: str, reason: str = "") -> Family:
        return Family(model_type=model_type, model_class=model_class, verdict=kind, reason=reason)

    config_class = _config_class(model_type)
    own = config_class.model_type
    if own != model_type and _maps("CAUSAL_LM").get(own) == model_class:
        return verdict("alias", f"of {own}")
    subs = list(getattr(config_class, "sub_configs", None) or {})
    hits = [k for k in _MULTIMODAL_MAPS if model_type in _maps(k)]
    media = [s for s in subs if re.search("vision|audio|image|speech|vq", s)]
    if hits or media:
        return verdict("multimodal", f"in MODEL_FOR_{hits[0]}" if hits else f"has {media[0]}")
    seq2seq = [k for k in _SEQ2SEQ_MAPS if model_type in _maps(k)]
    stacks = [s for s in subs if re.search("encoder|decoder", s)]
    if seq2seq or stacks:
        why = f"in MODEL_FOR_{seq2seq[0]}" if seq2seq else f"has {', '.join(stacks)}"
        return verdict("encoder-decoder", why)
    try:
        config = tiny_config(model_type)
    except Exception as e:
        moe = _moe(_defaults(config_class))
        if moe is not None:
            return verdict("MoE", f"{moe} by default (its tiny config fails)")
        return verdict("skipped", f"config: {_error(e)}")
    if getattr(config, "is_encoder_decoder", False):
        return verdict("encoder-decoder", "is_encoder_decoder=True")
    moe = _moe({n: getattr(config, n, None) for n in (*_EXPERT_COUNTS, *_MOE_SWITCHES)})
    if moe is not None:
        return verdict("MoE", moe)
    try:
        model = build(model_type, "meta")
    except Exception as e:
        return verdict("skipped", f"model: {_error(e)}")
    experts = sorted({type(m).__name__ for m in model.modules()
                      if _MOE_MODULE.search(type(m).__name__)})  # fmt: skip
    if experts:
        return verdict("MoE", f"has {experts[0]}")
    if decoder_layers(model):
        return verdict("kept")
    return verdict("other", "no decoder layer with q/k/v/o attention and a gated MLP")


@functools.cache
def survey() -> tuple[Family, ...]:
    """Every model type of the installed causal-LM mapping, sorted, classified."""
    import transformers

    transformers.logging.set_verbosity_error()
    return tuple(classify(t) for t in sorted(_maps("CAUSAL_LM")))


def kept() -> list[str]:
    """The model types the zoo test runs."""
    return [f.model_type for f in survey() if f.verdict == "kept"]


LOGITS = 1e-4  # relative error of the logits, high precision (fp32) at tp=2
LOSS = 5e-3  # the documented training-loss tolerance, relative
DOC = Path(__file__).parents[3] / "docs" / "parallelism.md"
BEGIN, END = "<!-- model-zoo:begin -->", "<!-- model-zoo:end -->"


def first_sentence(text: str) -> str:
    """The first sentence of an error, lists of more than 8 names shortened to their
    count (the message of an unmapped model lists every linear)."""
    sentence = re.split(r"\.\s+(?=[A-Z])", " ".join(text.split()), maxsplit=1)[0].rstrip(".")

    def shorten(m: re.Match) -> str:
        items = m.group(1).split(", ")
        return f"[{len(items)} names]" if len(items) > 8 else m.group(0)

    return re.sub(r"\[([^\[\]]*)\]", shorten, sentence) + "."


def outcome(res: dict) -> tuple[bool, str]:
    """(passed, the table's result) of one model type's ``real_models.zoo_check`` record:
    planned
    with logits, losses, parameter elements and tie as one process has them, or refused
    before any change; anything else fails."""
    if "crashed" in res:
        return False, f"CRASHED: {res['crashed'].strip().splitlines()[-1]}"
    if "refused" in res:
        if res["changes"]:
            return False, f"REFUSED AFTER CHANGES ({'; '.join(res['changes'])[:200]})"
        return True, f"refused: {first_sentence(res['refused'])}"
    wrong = []
    if not res["logits"] <= LOGITS:
        wrong.append(f"logits err {_sci(res['logits'])}")
    pairs = zip(res["losses"]["par"], res["losses"]["ref"], strict=True)
    if any(not abs(a - b) <= LOSS * abs(b) for a, b in pairs):
        par, ref = ([f"{x:.4g}" for x in res["losses"][k]] for k in ("par", "ref"))
        wrong.append(f"losses {', '.join(par)} against {', '.join(ref)}")
    before, after = res["tie"]
    if after != before:
        wrong.append(f"parameter elements and tie {before} -> {after}")
    if wrong:
        return False, f"WRONG (tp=2, SP): {'; '.join(wrong)}"
    return True, f"planned (tp=2, SP): logits err <= {_sci(LOGITS)}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")  # a cut error may leave a lone `


def _sci(x: float) -> str:
    """``x`` to one significant digit, as 1e-4 rather than 1e-04."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def doc_section(families: tuple[Family, ...], results: dict[str, dict]) -> str:
    """The docs section, markers included: the kept families' results, then the others
    by verdict."""
    import transformers

    lines = [
        BEGIN,
        "## Model zoo: the Llama-like families of transformers",
        "",
        *textwrap.wrap(
            f"Generated by `packages/mx-nn/tests/test_model_zoo.py` from transformers "
            f"{transformers.__version__} (`MX_UPDATE_DOCS=1` rewrites it; without, the test "
            f"checks it is current). Each causal-LM family whose decoder layer has "
            f"attention with q/k/v/o projections (or a fused `qkv_proj`) and a gated MLP "
            f"(gate/up/down, or a fused `gate_up_proj`), built tiny and random (hidden "
            f"{DIM}, {HEADS} heads, {KV_HEADS} key/value heads, head_dim {HEAD_DIM}, "
            f"intermediate {FFN}, {LAYERS} layers, vocabulary {VOCAB}, eager attention, "
            f"dropout 0, the family's own tying), goes through `mx_nn.parallelize(model, "
            f"mesh, recipe=None)` at tp=2 with sequence parallelism on 2 gloo ranks "
            f"against the same model on one process: logits within {_sci(LOGITS)} "
            f"(relative), two SGD steps' losses within {_sci(LOSS)} (relative), parameter "
            f"elements and tie unchanged; or refused with a ValueError before any change. "
            f"Which families are kept and why the others are not: "
            f"`packages/mx-nn/tests/model_zoo.py`.",
            width=90,
            break_on_hyphens=False,
        ),
        "",
        "| family | model class | result |",
        "|---|---|---|",
    ]
    by_type = {f.model_type: f for f in families}
    for t in sorted(results):
        lines.append(f"| {t} | {by_type[t].model_class} | {_cell(outcome(results[t])[1])} |")
    lines += ["", "Not run:", ""]
    titles = {
        "MoE": "mixture of experts",
        "multimodal": "multimodal",
        "encoder-decoder": "encoder-decoder, or the decoder of one",
        "other": "no decoder layer with q/k/v/o attention and a gated MLP",
        "alias": "aliases (the same config and model class as another type)",
    }
    for verdict, title in titles.items():
        names = [f.model_type for f in families if f.verdict == verdict]
        if names:
            lines.append(f"- {title} ({len(names)}): {', '.join(names)}.")
    skipped = [f for f in families if f.verdict == "skipped"]
    if skipped:
        lines.append(f"- config or model not buildable at these sizes ({len(skipped)}):")
        lines += [f"  - {f.model_type}: {_cell(f.reason)}" for f in skipped]
    return "\n".join([*lines, END]) + "\n"


def docs_section_now(path: Path = DOC) -> str | None:
    """The section between the markers in ``path`` (markers included), or None."""
    text = path.read_text()
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        return None
    return text[start : stop + len(END)] + "\n"


def write_docs_section(section: str, path: Path = DOC) -> None:
    """Replace the section in ``path``, or append it at the end."""
    text = path.read_text()
    start, stop = text.find(BEGIN), text.find(END)
    if start >= 0 and stop > start:
        text = text[:start] + section.rstrip("\n") + text[stop + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text if text.endswith("\n") else text + "\n")
