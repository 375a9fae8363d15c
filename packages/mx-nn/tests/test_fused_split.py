"""Phi-3's fused qkv_proj and gate_up_proj under mx_nn.parallelize (mx_nn.plan.fused):
split into their parts, each colwise-sharded with a standard Shard(0), on 2 gloo ranks
with the installed transformers' Phi3ForCausalLM (tiny, random):

- the state_dict holds the parts' keys; each part's full tensor is exactly the fused
  weight's rows (q, k, v / gate, up);
- a state_dict with the fused keys (the Hugging Face layout) loads into the parallelized
  model (``set_model_state_dict(..., full_state_dict=True)``) and gives the same logits,
  and into one at tp=1 (``load_state_dict``);
- DCP saved at tp=2 loads at tp=1 (the same keys: parallelize splits at every degree)
  exactly, and gives the same logits;
- head counts tp does not divide are refused, and the refusal leaves the model as it
  was (the split undone: module types, parameters, state_dict keys, the config);
- apply_tp alone refuses the fused model, naming split_fused.
(Logits and training against one process: test_real_models.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mx_dtensor.testing import spawn

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import these by name
from real_models import hf  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")
PARTS = {"self_attn.qkv_proj": ("q", "k", "v"), "mlp.gate_up_proj": ("gate", "up")}


def _phi3(seed: int, **overrides):
    torch.manual_seed(seed)
    return hf("phi3", pad_token_id=0, **overrides)


def _logits(model, tokens):
    out = model(tokens).logits
    return out.full_tensor() if hasattr(out, "full_tensor") else out


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _parts_match(model, fused: dict) -> bool:
    """Whether each part's (full) weight is exactly its rows of the fused weight."""
    ok = True
    for i in range(len(model.model.layers)):
        for path, names in PARTS.items():
            prefix = f"model.layers.{i}.{path}"
            got = torch.cat([_full(model.get_submodule(f"{prefix}.{n}").weight) for n in names])
            ok &= torch.equal(got, fused[f"{prefix}.weight"])
    return ok


def _split_keys(keys: list[str]) -> list[str]:
    """``keys`` with each fused weight's key replaced by its parts' keys."""
    out = []
    for k in keys:
        p = next((p for p in PARTS if k.endswith(f"{p}.weight")), None)
        out += [k] if p is None else [k.replace(f"{p}.weight", f"{p}.{n}.weight") for n in PARTS[p]]
    return sorted(out)


def _snapshot(model) -> tuple:
    attn = [layer.self_attn for layer in model.model.layers]
    return (
        [(n, type(m)) for n, m in model.named_modules()],
        [id(p) for p in model.parameters()],
        list(model.state_dict()),
        [id(a.config) for a in attn],
        [a.num_key_value_heads for a in attn],
    )


def _worker(rank: int, world: int, ckpt: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import mx_nn
    from mx_nn.plan.fused import SplitLinear

    tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    tp1 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("rep", "tp"))["tp"]
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    out = {}
    ref = _phi3(0)
    fused = {k: v.clone() for k, v in ref.state_dict().items()}
    mx_nn.convert(ref, "mxfp8", filter_fn=lambda _m, fqn: fqn != "lm_head")  # as parallelize
    with torch.no_grad():
        ref_logits = _logits(ref, tokens)

    par = mx_nn.parallelize(_phi3(0), tp, recipe="mxfp8")
    sd = par.state_dict()
    out["keys"] = sorted(sd)
    out["fused keys"] = sorted(fused)
    out["types"] = {type(par.get_submodule(f"model.layers.0.{p}")).__name__ for p in PARTS}
    parts = [v for k, v in sd.items() if ".qkv_proj." in k or ".gate_up_proj." in k]
    out["placements"] = {str(v.placements) for v in parts if isinstance(v, DTensor)}
    out["all DTensors"] = all(isinstance(v, DTensor) for v in parts)
    out["parts exact"] = _parts_match(par, fused)
    out["local q rows"] = par.model.layers[0].self_attn.qkv_proj.q.weight.to_local().shape[0]
    out["config heads"] = par.model.layers[0].self_attn.config.num_attention_heads
    out["model config heads"] = par.config.num_attention_heads
    with torch.no_grad():
        par_logits = _logits(par, tokens)
    out["logits vs one process"] = ((par_logits - ref_logits).norm() / ref_logits.norm()).item()

    # The Hugging Face layout (fused keys, full tensors) into a parallelized model, as
    # DCP's full-state-dict loader hands it to load_state_dict, and into one at tp=1.
    other = mx_nn.parallelize(_phi3(1), tp, recipe="mxfp8")
    set_model_state_dict(other, dict(fused), options=StateDictOptions(full_state_dict=True))
    out["fused load exact"] = _parts_match(other, fused)
    with torch.no_grad():
        out["fused load logits equal"] = torch.equal(_logits(other, tokens), par_logits)
    plain = mx_nn.parallelize(_phi3(1), tp1, recipe="mxfp8")
    plain.load_state_dict(fused)
    out["fused load exact"] &= _parts_match(plain, fused)

    # DCP at tp=2, loaded at tp=1 (plain tensors, the same parts' keys).
    dcp.save(par.state_dict(), checkpoint_id=ckpt)
    one = mx_nn.parallelize(_phi3(2), tp1, recipe="mxfp8")
    out["tp=1 split"] = isinstance(one.model.layers[0].self_attn.qkv_proj, SplitLinear)
    out["tp=1 keys"] = sorted(one.state_dict())
    state = one.state_dict()
    dcp.load(state, checkpoint_id=ckpt)
    one.load_state_dict(state)
    out["dcp tp=1 exact"] = _parts_match(one, fused)
    with torch.no_grad():
        one_logits = _logits(one, tokens)
    out["dcp tp=1 logits"] = ((one_logits - par_logits).norm() / par_logits.norm()).item()

    # Refused before any change: one key/value head at tp=2.
    odd = _phi3(3, num_key_value_heads=1)
    before = _snapshot(odd)
    try:
        mx_nn.parallelize(odd, tp, recipe="mxfp8")
        out["odd"] = "no error"
    except ValueError as e:
        out["odd"] = str(e)
    out["odd unchanged"] = _snapshot(odd) == before
    try:
        mx_nn.apply_tp(_phi3(4), tp)
        out["apply_tp"] = "no error"
    except ValueError as e:
        out["apply_tp"] = str(e)
    out["local shard placements ok"] = out["placements"] == {str((Shard(0),))}
    return out


def test_phi3_parts_state_dict_fused_load_and_dcp_across_degrees(tmp_path):
    results = spawn(_worker, 2, str(tmp_path / "ckpt"))
    for r in results:
        assert r["types"] == {"SplitLinear"}, r["types"]
        want = _split_keys(r["fused keys"])
        assert r["keys"] == want and r["tp=1 keys"] == want, (r["keys"], want)
        assert r["all DTensors"] and r["local shard placements ok"], r["placements"]
        assert r["parts exact"] and r["fused load exact"] and r["fused load logits equal"]
        assert r["local q rows"] == 128 and r["config heads"] == 4, r  # 8 heads at tp=2
        assert r["model config heads"] == 8  # the model's own config is left alone
        assert r["logits vs one process"] <= 1e-4, r["logits vs one process"]
        assert r["tp=1 split"] and r["dcp tp=1 exact"], r
        assert r["dcp tp=1 logits"] <= 1e-4, r["dcp tp=1 logits"]
        assert "has 8 query and 1 key/value heads" in r["odd"], r["odd"]
        assert r["odd unchanged"], "a refused parallelize left the split in place"
        assert "split_fused" in r["apply_tp"], r["apply_tp"]
