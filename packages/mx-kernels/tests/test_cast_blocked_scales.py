"""``scale_layout="blocked"``: the casts return each scale as the flat bytes of cuBLAS's
blocked layout, bit for bit ``swizzle_scales(plain).flatten()`` (padding zero), with the
codes of the plain cast; the Triton kernel writes them at their blocked offsets."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

import mx_core
import mx_kernels as mk
from mx_kernels import cast_plan
from mx_kernels.cast_launch import TILE_CONFIGS, empty_both, launch_cast
from mx_kernels.cast_triton import _blocked_offsets
from mx_kernels.swizzle import swizzle_scales, swizzled_shape

FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1"]
MODES = ["floor", "ceil", "even", "rceil"]
CASTS = ["quantize_rowwise", "quantize_colwise", "quantize_both"]
BACKENDS = ["reference", "triton"]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _data(shape, seed=0, nonfinite=True) -> torch.Tensor:
    """bf16 rows of very different magnitudes, a zero block, and (``nonfinite``) a NaN and
    an Inf (scale byte 255) in the first row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-12, 12, (shape[0], 1), generator=g))
    x[-1, -32:] = 0
    if nonfinite:
        x[0, 0], x[0, -1] = float("nan"), float("inf")
    return x.to(torch.bfloat16)


def _check_blocked(blocked, plain) -> None:
    """Codes equal the plain cast's; each scale is the plain scale matrix swizzled, flat."""
    assert len(blocked) == len(plain)
    for i, (b, p) in enumerate(zip(blocked, plain, strict=True)):
        if i % 2 == 0:  # codes
            assert b.dtype == p.dtype and b.shape == p.shape
            assert torch.equal(_u8(b), _u8(p)), f"output {i}: codes differ"
            continue
        assert b.dtype == torch.float8_e8m0fnu and b.dim() == 1 and b.is_contiguous()
        assert b.numel() == math.prod(swizzled_shape(*p.shape)), f"output {i}: size"
        want = swizzle_scales(p).flatten()
        assert torch.equal(_u8(b), _u8(want)), f"output {i}: blocked scale differs"


def _reference_plain(cast: str, x: torch.Tensor, fmt: str, mode: str):
    """mx-core's casts, as the public functions lay them out (values, any strides)."""
    row = mx_core.quantize(x, fmt, dim=-1, scale_mode=mode)
    col = mx_core.quantize(x.t().contiguous(), fmt, dim=-1, scale_mode=mode)
    return {
        "quantize_rowwise": (row.qdata, row.scale),
        "quantize_colwise": (col.qdata, col.scale),
        "quantize_both": (row.qdata, row.scale, col.qdata, col.scale),
    }[cast]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_and_mode(fmt, mode, cast, backend):
    # Scale matrices [32, 3] (rowwise) and [96, 1] (colwise): both padded in rows and
    # columns. Compared with mx-core's plain cast, which the plain casts equal (test_cast).
    x = _data((32, 96))
    got = getattr(mk, cast)(x, fmt, scale_mode=mode, backend=backend, scale_layout="blocked")
    _check_blocked(got, _reference_plain(cast, x, fmt, mode))


# Scale matrices of each shape: rowwise [M, K // 32], colwise [K, M // 32]; rows below
# and past 128, columns below and past 4: up to two by two tiles of 128x4 (the last
# shape of each cast). Small enough for the interpreter: its time grows with the tiles.
SHAPES = {
    "quantize_rowwise": [(1, 32), (33, 96), (130, 160)],
    "quantize_colwise": [(32, 33), (96, 130), (160, 130)],
    "quantize_both": [(32, 32), (96, 160)],
}
SHAPE_CASES = [
    (cast, shape, fmt)
    for cast, shapes in SHAPES.items()
    for shape in shapes
    for fmt in (["fp8_e4m3"] if shape[0] * shape[1] > 16000 else ["fp8_e4m3", "fp4_e2m1"])
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cast, shape, fmt", SHAPE_CASES, ids=str)
def test_shapes_match_the_plain_cast_swizzled(cast, shape, fmt, backend):
    fn = getattr(mk, cast)
    x = _data(shape)
    plain = fn(x, fmt, backend=backend)
    _check_blocked(fn(x, fmt, backend=backend, scale_layout="blocked"), plain)


def test_strided_x_and_fp32():
    x = _data((64, 96)).float().t()  # [96, 64], strided along K
    for cast in CASTS:
        fn = getattr(mk, cast)
        _check_blocked(
            fn(x, "fp4_e2m1", backend="triton", scale_layout="blocked"),
            fn(x, "fp4_e2m1", backend="triton"),
        )


@triton.jit
def _scatter_kernel(rows_ptr, cols_ptr, R, C, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.arange(0, BR)[:, None]
    c = tl.arange(0, BC)[None, :]
    mask = (r < R) & (c < C)
    offsets = _blocked_offsets(r, c, C)
    tl.store(rows_ptr + offsets, (r + 1).to(tl.uint8), mask=mask)
    tl.store(cols_ptr + offsets, (c + 1).to(tl.uint8), mask=mask)


@pytest.mark.parametrize("rows", [1, 31, 128, 130, 254])
@pytest.mark.parametrize("cols", [1, 3, 4, 9])
def test_kernel_offsets_follow_the_swizzle_definition(rows, cols):
    """Each element (r, c) lands where swizzle_scales puts it: written r + 1 and c + 1
    at the kernel's offsets, the two buffers equal the two index matrices swizzled."""
    n = math.prod(swizzled_shape(rows, cols))
    got_rows, got_cols = torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    block_r, block_c = triton.next_power_of_2(rows), triton.next_power_of_2(cols)
    _scatter_kernel[(1,)](got_rows, got_cols, rows, cols, block_r, block_c)
    r = torch.arange(1, rows + 1, dtype=torch.uint8)[:, None].expand(rows, cols)
    c = torch.arange(1, cols + 1, dtype=torch.uint8)[None, :].expand(rows, cols)
    assert torch.equal(got_rows, swizzle_scales(r).flatten())
    assert torch.equal(got_cols, swizzle_scales(c).flatten())


@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("tile", [None, "gpu"])
def test_the_kernel_writes_the_padding(cast, tile):
    """The blocked buffers are allocated uninitialised: the kernel writes the padding
    (zero bytes) itself. Launched into buffers of 0xFF bytes, with the interpreter's tile
    and with the tile the GPU runs (TILE_CONFIGS)."""
    x = _data((96, 160), nonfinite=False)
    f = mx_core.get_format("fp8_e4m3")
    q_row, s_row, q_col, s_col = empty_both(x.shape, f, 32, x.device, blocked=True)
    for s in (s_row, s_col):
        _u8(s).fill_(255)
    kind = cast.removeprefix("quantize_")
    row, col = kind != "colwise", kind != "rowwise"
    tile = TILE_CONFIGS[kind] if tile == "gpu" else None
    launch_cast(
        x, f, 32, "rceil", *((q_row, s_row) if row else (None, None)),
        *((q_col, s_col) if col else (None, None)), tile=tile, blocked=True,
    )  # fmt: skip
    plain = mk.quantize_both(x, backend="reference")
    got = (q_row, s_row, q_col, s_col)
    kept = [i for i, on in enumerate((row, row, col, col)) if on]
    _check_blocked([got[i] for i in kept], [plain[i] for i in kept])


def test_the_layout_keys_the_plans():
    x = _data((32, 64))
    args = ("quantize_rowwise", True, x, "fp8_e4m3", 32, "rceil", "triton")
    plain, blocked = cast_plan.plan_for(*args), cast_plan.plan_for(*args, "blocked")
    assert plain is not blocked
    assert cast_plan.plan_for(*args, "blocked") is blocked
    assert cast_plan.plan_for(*args, "plain") is not blocked


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: mk.quantize_rowwise(torch.zeros(2, 32), scale_layout="swizzled"),
            "quantize_rowwise: scale_layout='swizzled' is not one of 'plain', 'blocked'",
        ),
        (
            lambda: mk.quantize_both(torch.zeros(32, 32), scale_layout=None),
            "quantize_both: scale_layout=None is not one of 'plain', 'blocked'",
        ),
        (
            lambda: mk.quantize_colwise(torch.zeros(64, 64), block_size=64, scale_layout="blocked"),
            "quantize_colwise: scale_layout='blocked' needs block_size=32 .* got block_size=64",
        ),
        (
            lambda: mk.quantize_rowwise(torch.zeros(2, 3, 32), scale_layout="blocked"),
            r"quantize_rowwise: scale_layout='blocked' needs a 2-D x .* shape \(2, 3, 32\)",
        ),
        (
            lambda: torch.ops.mx.quantize_rowwise(
                torch.zeros(2, 32), "fp8_e4m3", 32, "rceil", "triton", "tiled"
            ),
            "quantize_rowwise: scale_layout='tiled' is not one of 'plain', 'blocked'",
        ),
        (
            lambda: torch.ops.mx.quantize_both(
                torch.zeros(64, 64, device="meta"), "fp8_e4m3", 64, "rceil", "auto", "blocked"
            ),
            "quantize_both: scale_layout='blocked' needs block_size=32",
        ),
    ],
)
def test_bad_layouts(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", CASTS)
def test_opcheck(op, backend):
    x = _data((64, 64), nonfinite=False)  # opcheck compares with assert_close: no NaN
    args = (x, "fp8_e4m3", 32, "rceil", backend, "blocked")
    torch.library.opcheck(getattr(torch.ops.mx, op), args)


def test_fake_sizes_and_compile():
    """The fake implementations give the blocked sizes, symbolic ones included: a
    dynamic-shape compile returns what eager does at two shapes."""

    def f(x):
        return (
            *mk.quantize_rowwise(x, backend="triton", scale_layout="blocked"),
            *mk.quantize_both(x, "fp4_e2m1", backend="triton", scale_layout="blocked"),
        )

    with torch._subclasses.FakeTensorMode():
        outs = f(torch.empty(160, 96, dtype=torch.bfloat16))
    assert [tuple(o.shape) for o in outs] == [
        (160, 96), (256 * 4,), (160, 48), (256 * 4,), (96, 80), (128 * 8,)
    ]  # fmt: skip
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for shape in [(64, 96), (96, 160)]:
        x = _data(shape)
        for got, want in zip(compiled(x), f(x), strict=True):
            assert got.shape == want.shape and torch.equal(_u8(got), _u8(want))
