"""mxstack in torchtitan 0.3's model-config converters (mx_nn.plan.torchtitan): selected
as torchtitan's trainer selects its float8/MXFP8 converters (``model_registry``'s
``converters``, ``--override.imports``), built as the trainer builds (meta device,
``init_states``), then run forward and backward on a tiny Llama3Model."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchtitan")

sys.path.insert(0, str(Path(__file__).parent))
from parallel_models import rel_err  # noqa: E402
from real_models import BATCH, SEQ, VOCAB, titan_llama3  # noqa: E402
from torchtitan.components.lora import LoRAConverter  # noqa: E402
from torchtitan.config.override import OverrideConfig, apply_overrides, parse_cli_imports  # noqa: E402
from torchtitan.models import llama3  # noqa: E402
from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.llama3.sharding import set_llama3_sharding_config  # noqa: E402

import mx_nn  # noqa: E402
from mx_dtensor.testing import spawn  # noqa: E402
from mx_nn.plan.torchtitan import MXStackConverter, TitanMXLinear  # noqa: E402

MXFP8 = mx_nn.MXLinearConfig.from_recipe("mxfp8")


def _linear_types(model_config) -> dict[str, type]:
    return {fqn: type(cfg) for fqn, cfg, _, _ in model_config.traverse(Linear.Config)}


def _tiny_config(fuse_qkv: bool):
    """The root config of real_models' tiny Llama3Model (Decoder keeps it)."""
    return copy.deepcopy(titan_llama3(fuse_qkv).config)


def _trainer_build(model_config) -> torch.nn.Module:
    """As torchtitan's trainer builds: on the meta device, the Module check, then the
    weights materialised and initialised by their param_init."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = model_config.build()
    model.verify_module_protocol()
    model.to_empty(device="cpu")
    model.init_states()
    return model


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def test_model_registry_runs_the_converter_before_build():
    spec = llama3.model_registry("debugmodel", converters=[MXStackConverter.Config()])
    types = _linear_types(spec.model)
    assert types.pop("lm_head") is Linear.Config  # high precision by default
    assert types and set(types.values()) == {TitanMXLinear.Config}
    with torch.device("meta"):
        model = spec.model.build()
    model.verify_module_protocol()  # what the trainer checks right after build
    assert type(model.layers["0"].attention.qkv_linear.wqkv) is TitanMXLinear
    assert type(model.lm_head) is Linear
    assert model.layers["0"].feed_forward.w1.config == MXFP8


@pytest.mark.parametrize("fuse_qkv", [True, False], ids=["wqkv", "wq-wk-wv"])
def test_tiny_llama3_converted_trains(fuse_qkv):
    base = _tiny_config(fuse_qkv)
    ref = _trainer_build(copy.deepcopy(base))
    converter = MXStackConverter.Config(recipe="mxfp8").build()
    model = _trainer_build(converter.convert(copy.deepcopy(base)))

    mx = {n: m for n, m in model.named_modules() if isinstance(m, mx_nn.MXLinear)}
    linears = {n for n, m in ref.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(mx) == linears - {"lm_head"} and len(mx) == 2 * (7 if not fuse_qkv else 5)
    assert all(type(m) is TitanMXLinear and m.config == MXFP8 for m in mx.values())
    # param_init carried: the same seed gives the same weights under the same keys.
    ref_state, state = ref.state_dict(), model.state_dict()
    assert state.keys() == ref_state.keys()
    assert all(torch.equal(state[k], ref_state[k]) for k in state)

    tokens = _tokens(0)
    logits = model(tokens)
    with torch.no_grad():
        assert 1e-5 < rel_err(logits, ref(tokens)) < 0.05  # mxfp8 against fp32
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), _tokens(1).flatten())
    loss.backward()
    for name, m in mx.items():
        assert m.weight.grad is not None and m.weight.grad.isfinite().all(), name


def test_filter_fqns_and_the_lm_head():
    config = _tiny_config(True)
    MXStackConverter.Config(filter_fqns=["feed_forward"]).build().convert(config)
    types = _linear_types(config)  # the list replaces the default: the LM head is MX
    assert types["layers.0.feed_forward.w1"] is Linear.Config
    assert types["lm_head"] is types["layers.0.attention.qkv_linear.wqkv"] is TitanMXLinear.Config

    config = _tiny_config(True)
    MXStackConverter.Config(filter_fqns=[]).build().convert(config)
    assert set(_linear_types(config).values()) == {TitanMXLinear.Config}


def test_the_trainers_sharding_config_reaches_the_mx_linears():
    # update_from_config (which imports the trainer) sets it after the converters ran.
    config = _tiny_config(False)
    MXStackConverter.Config().build().convert(config)
    set_llama3_sharding_config(config, enable_sp=True)
    with torch.device("meta"):
        model = config.build()
    wo = model.layers["1"].attention.wo
    assert type(wo) is TitanMXLinear and wo._sharding_config is not None
    assert wo._sharding_config == config.layers[1].attention.wo.sharding_config


def test_selected_by_name_through_torchtitans_overrides():
    spec = llama3.model_registry("debugmodel")
    imports = parse_cli_imports(['mx_nn.plan.torchtitan.mxstack={"recipe": "mxfp4"}'])
    replaced = apply_overrides(OverrideConfig(imports=imports), spec)
    assert len(replaced) == 30
    types = _linear_types(spec.model)
    assert types.pop("lm_head") is Linear.Config
    assert set(types.values()) == {TitanMXLinear.Config}
    mxfp4 = mx_nn.MXLinearConfig.from_recipe("mxfp4")
    assert spec.model.layers[0].feed_forward.w2.mx == mxfp4


def test_a_bad_recipe_names_the_allowed_ones():
    allowed = "allowed: mxfp8, mxfp8_floor, mxfp8_e5m2_grads, mxfp8_hp_wgrad, mxfp6, mxfp4"
    with pytest.raises(ValueError, match=f"recipe='mxfp9' is not a recipe; {allowed}"):
        MXStackConverter.Config(recipe="mxfp9").build()
    with pytest.raises(ValueError, match="recipe='fp8' is not a recipe; allowed: mxfp8"):
        imports = [("mx_nn.plan.torchtitan.mxstack", {"recipe": "fp8"})]
        apply_overrides(OverrideConfig(imports=imports), llama3.model_registry("debugmodel"))
    with pytest.raises(TypeError, match="filter_fqns must be a list"):
        MXStackConverter.Config(filter_fqns="lm_head").build()
    with pytest.raises(ValueError, match="an empty entry would match every FQN"):
        MXStackConverter.Config(filter_fqns=[""]).build()


def test_converting_again():
    config = MXStackConverter.Config().build().convert(_tiny_config(True))
    before = copy.deepcopy(_linear_types(config))
    MXStackConverter.Config().build().convert(config)  # same recipe: nothing changes
    assert _linear_types(config) == before
    with pytest.raises(ValueError, match=r"already TitanMXLinear with another config.*wqkv"):
        MXStackConverter.Config(recipe="mxfp4").build().convert(config)
    assert _linear_types(config) == before  # refused before any change
    MXStackConverter.Config(recipe="mxfp4", filter_fqns=["layers"]).build().convert(config)
    assert config.lm_head.mx == mx_nn.MXLinearConfig.from_recipe("mxfp4")
    assert config.layers[0].attention.wo.mx == MXFP8


def test_lora_after_mxstack_and_the_order_torchtitan_checks():
    converters = [MXStackConverter.Config(), LoRAConverter.Config(rank=4)]
    config = _tiny_config(True)
    for c in converters:  # as model_registry applies them
        config = c.build().convert(config)
    model = _trainer_build(config)
    w1 = model.layers["0"].feed_forward.w1
    assert isinstance(w1, TitanMXLinear) and not w1.weight.requires_grad
    model(_tokens(0)).sum().backward()
    assert w1.lora_b.weight.grad is not None
    with pytest.raises(ValueError, match="must be applied before LoRAConverter"):
        llama3.model_registry("debugmodel", converters=converters[::-1])


def _parallelized_error(rank: int, world: int) -> float:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    config = MXStackConverter.Config().build().convert(_tiny_config(False))
    model = _trainer_build(config)
    par = mx_nn.parallelize(copy.deepcopy(model), mesh, recipe="mxfp8")
    assert type(par.layers["0"].attention.wo) is TitanMXLinear
    with torch.no_grad():
        return rel_err(par(_tokens(0)), model(_tokens(0)))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")
def test_mx_nn_parallelize_takes_the_converted_model():
    assert all(err < 1e-4 for err in spawn(_parallelized_error, 2))  # tp=2 with SP


def test_importing_mx_nn_registers_no_override():
    code = (
        "import importlib, sys, mx_nn, mx_nn.plan\n"
        "override = importlib.import_module('torchtitan.config.override')\n"
        "assert 'mx_nn.plan.torchtitan' not in sys.modules\n"
        "assert not [k for k in override._REGISTRY if k.startswith('mx_nn')]\n"
        "import mx_nn.plan.torchtitan\n"
        "assert 'mx_nn.plan.torchtitan.mxstack' in override._REGISTRY\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_torchtitan_example():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    (block,) = re.findall(r"```python torchtitan\n(.*?)```", readme, flags=re.S)
    exec(compile(block, "README.md", "exec"), {})
