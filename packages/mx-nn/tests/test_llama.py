import math

import pytest
import torch

import mx_nn
from mx_nn.models.llama import apply_rope, rope_tables

SMALL = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, max_seq_len=32)


def test_module_names_follow_torchtitan():
    model = mx_nn.models.Llama(mx_nn.models.LlamaConfig(**SMALL))
    names = {n for n, _ in model.named_parameters()}
    per_layer = ["attention_norm.weight", "ffn_norm.weight"]
    per_layer += [f"attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
    per_layer += [f"feed_forward.{w}.weight" for w in ("w1", "w2", "w3")]
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    expected |= {f"layers.{i}.{p}" for i in range(2) for p in per_layer}
    assert names == expected
    assert set(model.state_dict()) == expected  # the RoPE tables are not persistent
    attn = model.layers[0].attention
    assert (attn.n_local_heads, attn.n_local_kv_heads, attn.head_dim) == (4, 2, 16)
    assert attn.wk.weight.shape == (32, 64) and attn.wq.weight.shape == (64, 64)


def test_causal_and_shapes():
    torch.manual_seed(0)
    model = mx_nn.models.Llama(mx_nn.models.LlamaConfig(**SMALL))
    tokens = torch.randint(0, 256, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 256) and logits.dtype == torch.float32
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    # Changing tokens from position 10 on leaves earlier logits as they were.
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10], rtol=0, atol=0)
    assert not torch.equal(model(changed)[:, 10:], logits[:, 10:])


def test_gqa_matches_full_heads_with_repeated_kv():
    """GQA with n_kv_heads=2 equals multi-head attention whose k/v weights repeat each
    kv head's rows for its query heads."""
    torch.manual_seed(0)
    gqa = mx_nn.models.Attention(mx_nn.models.LlamaConfig(**SMALL))
    mha = mx_nn.models.Attention(mx_nn.models.LlamaConfig(**{**SMALL, "n_kv_heads": 4}))
    with torch.no_grad():
        mha.wq.weight.copy_(gqa.wq.weight)
        mha.wo.weight.copy_(gqa.wo.weight)
        for name in ("wk", "wv"):
            w = getattr(gqa, name).weight.unflatten(0, (2, 16))
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).flatten(0, 1))
    rope = rope_tables(16, 32, 10000.0)
    x = torch.randn(2, 12, 64)
    torch.testing.assert_close(gqa(x, rope), mha(x, rope), rtol=1e-5, atol=1e-6)


def test_rope_rotates_pairs_and_keeps_norms():
    rope = rope_tables(8, 5, 100.0)
    x = torch.randn(1, 5, 3, 8)
    out = apply_rope(x, rope)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[:, 0], x[:, 0])  # position 0: no rotation
    # Position 2, pair 1: angle 2 * 100 ** (-2 / 8).
    angle = 2 * 100 ** (-2 / 8)
    a, b = x[0, 2, 0, 2].item(), x[0, 2, 0, 3].item()
    c, s = math.cos(angle), math.sin(angle)
    expected = [a * c - b * s, a * s + b * c]
    torch.testing.assert_close(out[0, 2, 0, 2:4], torch.tensor(expected))


def test_init_is_reproducible_and_convert_keeps_names():
    torch.manual_seed(3)
    a = mx_nn.models.Llama(mx_nn.models.LlamaConfig(**SMALL))
    torch.manual_seed(3)
    b = mx_nn.models.Llama(mx_nn.models.LlamaConfig(**SMALL))
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na
    keys = set(b.state_dict())
    mx_nn.convert(b, "mxfp8")
    assert isinstance(b.layers[1].feed_forward.w2, mx_nn.MXLinear)
    assert set(b.state_dict()) == keys
    tokens = torch.randint(0, 256, (2, 32))
    loss = torch.nn.functional.cross_entropy(b(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    assert math.isfinite(loss.item())


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"dim": 60, "n_heads": 8}, ValueError, "dim=60 must be divisible by n_heads=8"),
        ({"n_kv_heads": 3}, ValueError, "n_heads=4 must be divisible by n_kv_heads=3"),
        ({"n_layers": 0}, ValueError, "n_layers=0 must be positive"),
        ({"dim": 64.0}, TypeError, "dim must be an int"),
        ({"rope_theta": -1.0}, ValueError, "rope_theta"),
        ({"dim": 12, "n_heads": 4, "n_kv_heads": 1}, ValueError, "head_dim=3"),
    ],
)
def test_config_validation(overrides, error, match):
    with pytest.raises(error, match=match):
        mx_nn.models.LlamaConfig(**{**SMALL, **overrides})


def test_too_long_sequence_is_an_error():
    model = mx_nn.models.Llama(mx_nn.models.LlamaConfig(**SMALL))
    with pytest.raises(ValueError, match="exceeds max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
