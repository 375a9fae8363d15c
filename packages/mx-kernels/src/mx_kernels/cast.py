"""MX casts as ``torch.library`` ops: rowwise, columnwise, and both from one read.

=====================  ===============================  ==========================
function               op                               blocks along
=====================  ===============================  ==========================
``quantize_rowwise``   ``mx::quantize_rowwise``         the last dim, any rank
``quantize_colwise``   ``mx::quantize_colwise``         dim 0 of a 2-D x [M, K];
                                                        written as the row-major
                                                        cast of x^T: [K, M]
``quantize_both``      ``mx::quantize_both``            both of the above
=====================  ===============================  ==========================

All three are bit-identical to :func:`mx_core.quantize`. The scales of
``quantize_colwise``, and both scales of ``quantize_both``, come back column-major
(``scale.t()`` is contiguous; see :func:`quantize_colwise` and :func:`quantize_both`);
the ops themselves return those contiguous buffers, which the functions transpose.
Triton runs every format and scale mode for power-of-two block sizes up to 128 (fp6/fp4
codes are built in integer arithmetic; fp8 uses the GPU's conversion); other block sizes
run mx-core's reference on the same device (``backend="auto"`` logs that choice once;
``backend="triton"`` raises instead).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

import mx_core
from mx_core import ElementFormat, get_format, get_scale_mode
from mx_kernels.backend import (
    BACKENDS,
    TRITON_BLOCK_SIZES,
    interpreter_enabled,
    log_choice,
    persistent_programs,
    resolve_backend_for,
)
from mx_kernels.launch import KernelLauncher
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = ["quantize_rowwise", "quantize_colwise", "quantize_both"]


def _choose(
    op: str, backend: str, x: torch.Tensor, fmt: ElementFormat, block_size: int, dims: tuple
) -> str:
    """The implementation an op body runs, after the checks of the tensor's shape: the
    op bodies always see real tensors (local shards under DTensor, run-time tensors
    under torch.compile), so these checks live here, not in the public functions."""
    shape = x.shape
    # The common case in a few comparisons (this is every cast's hot path); anything
    # else gets the full checks, which raise with the argument named.
    rank_ok = len(shape) >= 1 if dims == (-1,) else len(shape) == 2
    fine = (
        rank_ok
        and x.dtype in mx_core.INPUT_DTYPES
        and block_size > 0
        and not block_size % 2
        and all(shape[d] % block_size == 0 for d in dims)
    )
    if not fine:
        if dims != (-1,) and x.dim() != 2:
            raise ValueError(f"{op}: x must be 2-D [M, K], got shape {tuple(x.shape)}")
        for dim in dims:
            mx_core.check_quantize_args(x, block_size, dim, fn=op)
    gap = None
    if block_size not in TRITON_BLOCK_SIZES:
        gap = f"block_size={block_size} has no Triton cast (Triton: {TRITON_BLOCK_SIZES})"
    return resolve_backend_for(op, backend, x.device, gap)


class CastTile(NamedTuple):
    """How the Triton cast splits x [M, K]: tiles of [block_m, block_k] elements, one
    program of ``warps`` warps per tile, launched down M first or with ``k_first`` along
    K first; or with ``programs_per_sm`` > 0 a persistent grid whose programs loop over
    tiles with loads software-pipelined over ``stages``. ``max_regs`` > 0 caps the
    registers per thread (Triton's ``maxnreg``; CUDA only). ``lanes_m`` > 0 permutes a
    tile's rows so that each warp holds one MX block of rows, given that Triton puts
    ``lanes_m`` rows in a warp's lanes (it must divide the block size, and block_m must be
    warps * block size; otherwise it is ignored). ``words`` (with ``lanes_m`` = block size
    / 4, fp8 and fp6 casts of x^T) gives each thread four consecutive rows instead, whose
    transposed codes it packs into one 32-bit word."""

    block_m: int
    block_k: int
    warps: int
    programs_per_sm: int = 0
    stages: int = 1
    k_first: bool = False
    max_regs: int = 0
    lanes_m: int = 0
    words: bool = False

    def __str__(self) -> str:
        extra = f", {self.programs_per_sm}/SM x{self.stages} stages" if self.programs_per_sm else ""
        extra += ", K first" if self.k_first else ""
        extra += f", <= {self.max_regs} regs" if self.max_regs else ""
        extra += f", rows permuted ({self.lanes_m} lanes)" if self.lanes_m else ""
        extra += ", word stores" if self.words and self.lanes_m else ""
        return f"{self.block_m}x{self.block_k} {self.warps}w{extra}"


# Per cast kind, "fake_" kinds for the fake-quantize outputs: the best of
# tools/bench/casts.py --sweep on the H200 (BENCHMARKS.md). Tiles grow to hold one MX
# block. Columnwise tiles are one MX block tall, so that the block's amax is reduced
# within a warp; "both" instead takes four blocks of rows, one per warp (rows permuted
# to match Triton's layout), so that its transposed codes go out in whole 128-byte
# lines, with registers capped to fit five programs per SM; each thread packs four
# rows' codes into a word, so the transpose moves words through shared memory, not
# bytes (the byte transpose took about a quarter of the kernel's time: BENCHMARKS.md,
# 2026-12-03 'Casts: CUDA-graph timing').
# Launch order: programs that follow each other write neighbouring bytes of the largest
# output when row-major outputs go K first and the transposed ones M first; "both"
# measured faster K first (0.89-0.90 of copy against 0.85-0.87 M first: BENCHMARKS.md,
# 2026-12-03 'Casts: word stores').
TILE_CONFIGS: dict[str, CastTile] = {
    "rowwise": CastTile(8, 1024, 4, k_first=True),
    "colwise": CastTile(32, 128, 1),
    "both": CastTile(128, 64, 4, k_first=True, max_regs=96, lanes_m=8, words=True),
    "fake_rowwise": CastTile(4, 2048, 8, k_first=True),
    "fake_colwise": CastTile(32, 128, 1, k_first=True),  # writes [M, K], not x^T
    "fake_both": CastTile(32, 128, 2, k_first=True),
}
_INTERPRETER_TILE = CastTile(32, 64, 4)  # small: the interpreter's cost grows with tile size


def _tile(kind: str, block_size: int, tile: tuple[int, ...] | None, interpreter: bool) -> CastTile:
    t = CastTile(*(tile or (_INTERPRETER_TILE if interpreter else TILE_CONFIGS[kind])))
    block_m = max(t.block_m, 1 if kind.endswith("rowwise") else block_size)
    t = t._replace(block_m=block_m, block_k=max(t.block_k, block_size))
    if t.lanes_m and (block_size % t.lanes_m or t.block_m != t.warps * block_size):
        t = t._replace(lanes_m=0)  # the row permutation is only defined for this shape
    if t.words and (t.lanes_m * 4 != block_size or kind not in ("colwise", "both")):
        t = t._replace(words=False)
    return t


@functools.lru_cache(maxsize=512)
def _launch_config(
    kind: str,
    fmt_name: str,
    block_size: int,
    scale_mode: str,
    tile: tuple[int, ...] | None,
    hw_round: bool,
    interpreter: bool,
    s_row_t: bool = False,
) -> tuple[CastTile, KernelLauncher]:
    """The tile and the launcher (kernel constants bound) of one cast configuration:
    built once, since a cast's host time is measured against a kernel of a few to tens
    of microseconds (BENCHMARKS.md, 2026-12-03 'Host cost per op'). ``interpreter``
    (TRITON_INTERPRET on a CPU tensor) keys the cache, since it changes the default
    tile."""
    from mx_kernels.cast_triton import FMT_IDS, MODE_IDS, mx_cast_kernel

    fmt = get_format(fmt_name)
    t = _tile(kind, block_size, tile, interpreter)
    constants = dict(
        BLOCK_M=t.block_m,
        BLOCK_K=t.block_k,
        BS=block_size,
        FMT=FMT_IDS[fmt.name],
        MODE=MODE_IDS[scale_mode],
        EMAX=fmt.emax,
        MBITS=fmt.mbits,
        MAX_NORMAL=fmt.max_normal,
        MAX_FRAC=fmt.max_normal_mantissa_bits,
        EMIN=fmt.emin,
        BITS=fmt.bits,
        PACK=2 if fmt.is_packed else 1,
        HW_ROUND=hw_round,
        ROWWISE=kind.endswith(("rowwise", "both")),
        COLWISE=kind.endswith(("colwise", "both")),
        DEQ=kind.startswith("fake_"),
        PERSISTENT=bool(t.programs_per_sm),
        STAGES=t.stages,
        K_FIRST=t.k_first,
        LANES_M=t.lanes_m,
        S_ROW_T=s_row_t,
        WORDS_T=t.words and not fmt.is_packed,
        num_warps=t.warps,
        **({"maxnreg": t.max_regs} if t.max_regs else {}),
    )
    return t, KernelLauncher(mx_cast_kernel, constants, tensors=5)


@functools.cache
def _no_output(device: torch.device) -> torch.Tensor:
    """A zero-size uint8 tensor passed for outputs a cast does not write."""
    return torch.empty(0, dtype=torch.uint8, device=device)


_KINDS = {
    (True, False, False): "rowwise",
    (False, True, False): "colwise",
    (True, True, False): "both",
    (True, False, True): "fake_rowwise",
    (False, True, True): "fake_colwise",
    (True, True, True): "fake_both",
}


def _launch(
    x2d,
    fmt: ElementFormat,
    block_size: int,
    scale_mode: str,
    q_row,
    s_row,
    q_col,
    s_col,
    tile: tuple[int, ...] | None = None,
    hw_round: bool | None = None,
    dequantized: bool = False,
) -> None:
    """Run the Triton cast on a 2-D x; None outputs are skipped.

    ``dequantized``: q_row and q_col receive the fake-quantized values instead (in their
    own dtype, both [M, K] row-major), s_row and s_col must be None. ``s_row`` is
    row-major (any rank, [..., K // block_size]) or, 2-D, column-major (strides (1, M)).

    ``tile`` (a :class:`CastTile` or the tuple of its fields) overrides TILE_CONFIGS;
    ``hw_round`` overrides the rounding path (default: the GPU's fp8 conversion on CUDA,
    fp32 arithmetic in the interpreter). Benchmarks sweep these; every choice is
    bit-exact where it runs.
    """
    m, k = x2d.shape
    kind = _KINDS[(q_row is not None, q_col is not None, dequantized)]
    device = x2d.device
    cuda = device.type == "cuda"
    hw_round = cuda if hw_round is None else hw_round
    s_row_t = False  # rowwise scales row-major, or column-major (quantize_both's)
    s_row_strides = (0, 0)
    if s_row is not None:
        if s_row.is_contiguous():
            s_row_strides = (k // block_size, 1)
        elif s_row.dim() == 2 and s_row.stride() == (1, m):
            s_row_t, s_row_strides = True, (1, m)
        else:
            raise ValueError(f"_launch: s_row strides {s_row.stride()}: need row- or column-major")
    t, launcher = _launch_config(
        kind, fmt.name, block_size, scale_mode, None if tile is None else tuple(tile),
        hw_round, not cuda and interpreter_enabled(), s_row_t,
    )  # fmt: skip
    dummy = _no_output(device)

    def u8(out):
        return dummy if out is None else out if dequantized else out.view(torch.uint8)

    grid = (-(-m // t.block_m), -(-k // t.block_k))
    tiles, tiles_per_program = grid[0] * grid[1], 1
    if t.programs_per_sm:
        grid = (min(tiles, persistent_programs(device, t.programs_per_sm)),)
        tiles_per_program = -(-tiles // grid[0])
    elif t.k_first:
        grid = (tiles,)
    launcher(
        grid, x2d, u8(q_row), u8(s_row), u8(q_col), u8(s_col), m, k,
        x2d.stride(0), x2d.stride(1), *s_row_strides, tiles_per_program,
    )  # fmt: skip


def _empty_cast(
    shape, fmt: ElementFormat, block_size: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (qdata, scale) of a rowwise cast of a tensor of ``shape``."""
    *lead, k = shape
    qk = k // 2 if fmt.is_packed else k
    qdata = torch.empty(*lead, qk, dtype=fmt.storage_dtype, device=device)
    scale = torch.empty(*lead, k // block_size, dtype=torch.float8_e8m0fnu, device=device)
    return qdata, scale


def _empty_cast_t(
    x_shape, fmt: ElementFormat, block_size: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised outputs of the columnwise op for a 2-D x of ``x_shape`` [M, K]:
    qdata_t [K, M] and the scales' buffer [M // block_size, K], both contiguous.

    The ops return that buffer and the public functions its transpose, scale_t: the
    ops' outputs stay contiguous, since with a transposed output Inductor's generated
    code asserted contiguous strides once shapes turned dynamic (torch 2.13)."""
    m, k = x_shape
    qdata_t = torch.empty(k, m // 2 if fmt.is_packed else m, dtype=fmt.storage_dtype, device=device)
    scale_buf = torch.empty(m // block_size, k, dtype=torch.float8_e8m0fnu, device=device)
    return qdata_t, scale_buf


def _empty_both(
    x_shape, fmt: ElementFormat, block_size: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised outputs of the both op for a 2-D x of ``x_shape`` [M, K]: q_row
    [M, K] (fp4: [M, K // 2]), the rowwise scales' buffer [K // block_size, M] (the
    public s_row is its transpose), then :func:`_empty_cast_t`'s two; all contiguous."""
    m, k = x_shape
    q_row = torch.empty(m, k // 2 if fmt.is_packed else k, dtype=fmt.storage_dtype, device=device)
    s_row_buf = torch.empty(k // block_size, m, dtype=torch.float8_e8m0fnu, device=device)
    return q_row, s_row_buf, *_empty_cast_t(x_shape, fmt, block_size, device)


def _reference(x, fmt, block_size, scale_mode):
    t = mx_core.quantize(x, fmt, block_size=block_size, dim=-1, scale_mode=scale_mode)
    return t.qdata, t.scale


def _reference_t(x, fmt, block_size, scale_mode):
    """mx-core's columnwise cast of x [M, K], in the layout of :func:`_empty_cast_t`."""
    qdata_t, scale_t = _reference(x.t().contiguous(), fmt, block_size, scale_mode)
    return qdata_t, scale_t.t().contiguous()


def _quantize_rowwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("quantize_rowwise", backend, x, f, block_size, (-1,)) == "reference":
        return _reference(x, f, block_size, scale_mode)
    qdata, scale = _empty_cast(x.shape, f, block_size, x.device)
    x2d = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    _launch(x2d, f, block_size, scale_mode, qdata, scale, None, None)
    return qdata, scale


def _quantize_colwise_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("quantize_colwise", backend, x, f, block_size, (0,)) == "reference":
        return _reference_t(x, f, block_size, scale_mode)
    q_t, s_t = _empty_cast_t(x.shape, f, block_size, x.device)
    _launch(x, f, block_size, scale_mode, None, None, q_t, s_t)
    return q_t, s_t


def _quantize_both_impl(x, fmt: str, block_size: int, scale_mode: str, backend: str):
    f = get_format(fmt)
    if _choose("quantize_both", backend, x, f, block_size, (-1, 0)) == "reference":
        q_row, s_row = _reference(x, f, block_size, scale_mode)
        return q_row, s_row.t().contiguous(), *_reference_t(x, f, block_size, scale_mode)
    if f.is_packed and x.stride(1) != 1:
        # On the H200 (triton 3.6) the fused cast wrote wrong columnwise scales and codes
        # for fp4 from an fp32 x strided along K (x.t() of a contiguous tensor), while
        # from a contiguous x it was exact (BENCHMARKS.md, 2026-12-03 'Casts: word
        # stores'; reproducer: tools/bench/repro_both_fp4.py). Until that is understood,
        # it reads a copy.
        log_choice("quantize_both", "triton", x.device.type, "fp4, x strided along K: copy")
        x = x.contiguous()
    q_row, s_row_buf, q_col, s_col = _empty_both(x.shape, f, block_size, x.device)
    _launch(x, f, block_size, scale_mode, q_row, s_row_buf.t(), q_col, s_col)
    return q_row, s_row_buf, q_col, s_col


_CAST_ARGS = "(Tensor x, str fmt, SymInt block_size, str scale_mode, str backend)"
QUANTIZE_ROWWISE = define_op(
    f"quantize_rowwise{_CAST_ARGS} -> (Tensor, Tensor)",
    _quantize_rowwise_impl,
    lambda x, fmt, block_size, scale_mode, backend: _empty_cast(
        x.shape, get_format(fmt), block_size, x.device
    ),
)
QUANTIZE_COLWISE = define_op(
    f"quantize_colwise{_CAST_ARGS} -> (Tensor, Tensor)",
    _quantize_colwise_impl,
    lambda x, fmt, block_size, scale_mode, backend: _empty_cast_t(
        x.shape, get_format(fmt), block_size, x.device
    ),
)
QUANTIZE_BOTH = define_op(
    f"quantize_both{_CAST_ARGS} -> (Tensor, Tensor, Tensor, Tensor)",
    _quantize_both_impl,
    lambda x, fmt, block_size, scale_mode, backend: _empty_both(
        x.shape, get_format(fmt), block_size, x.device
    ),
)


def _check(fn: str, x, fmt, block_size, scale_mode, backend) -> tuple[str, str]:
    """Validate the public functions' arguments that the op bodies do not see as
    tensors; returns the format's and the scale mode's canonical names. The shape
    checks run in the op bodies (:func:`_choose`), on the tensors that really run."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{fn}: block_size must be an int, got {type(block_size).__name__}")
    names = _names.__wrapped__ if torch.compiler.is_compiling() else _names  # dynamo: no caches
    try:
        return names(fmt, scale_mode, backend)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: {e}") from None


@functools.lru_cache(maxsize=256)
def _names(fmt, scale_mode, backend) -> tuple[str, str]:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    return get_format(fmt).name, get_scale_mode(scale_mode).value


def quantize_rowwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast with blocks along the last dim.

    Args:
        x: [..., K] fp32/bf16/fp16, K divisible by ``block_size``; any strides.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
    Returns:
        ``(qdata, scale)``: qdata [..., K] (fp4: [..., K // 2] uint8), scale
        [..., K // block_size] float8_e8m0fnu; both contiguous. Equal to
        ``mx_core.quantize(x, fmt, dim=-1, ...)``'s ``qdata`` and ``scale``.
    """
    name, mode = _check("quantize_rowwise", x, fmt, block_size, scale_mode, backend)
    if may_skip_dispatch(x):
        return _quantize_rowwise_impl(x, name, block_size, mode, backend)
    return QUANTIZE_ROWWISE(x, name, block_size, mode, backend)


def quantize_colwise(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast of a 2-D x [M, K] with blocks along M, laid out as the cast of x^T.

    Returns:
        ``(qdata_t, scale_t)``: qdata_t [K, M] (fp4: [K, M // 2]) row-major, and scale_t
        [K, M // block_size] stored column-major: ``scale_t.t()`` is the contiguous
        [M // block_size, K] buffer (strides (1, K)). Both are equal to
        ``mx_core.quantize(x.t().contiguous(), fmt, dim=-1, ...)``'s ``qdata`` and
        ``scale``, without materialising the transpose.

    Why scale_t is column-major: a tile of the cast covers few blocks along M, so
    row-major scales would be written a byte or two per row; column-major they are
    written in whole rows, which made the cast 13% faster on the H200 (BENCHMARKS.md).
    It is also the layout Transformer Engine keeps columnwise MXFP8 scales in. Call
    ``scale_t.contiguous()`` for a row-major copy.
    """
    name, mode = _check("quantize_colwise", x, fmt, block_size, scale_mode, backend)
    op = _quantize_colwise_impl if may_skip_dispatch(x) else QUANTIZE_COLWISE
    qdata_t, scale_buf = op(x, name, block_size, mode, backend)
    return qdata_t, scale_buf.t()


def quantize_both(
    x: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rowwise and columnwise casts of a 2-D x [M, K] from one read of x.

    Returns:
        ``(q_row, s_row, q_col_t, s_col_t)``: the values of :func:`quantize_rowwise` then
        :func:`quantize_colwise` of x. q_row [M, K] and q_col_t [K, M] are row-major
        (fp4: [M, K // 2] and [K, M // 2]); both scales are column-major: s_row
        [M, K // block_size] with strides (1, M), s_col_t [K, M // block_size] with
        strides (1, K).

    Why s_row is column-major here (not in :func:`quantize_rowwise`): a tile of this
    cast covers many rows and few blocks along K, so column-major scales go out as
    contiguous runs per block column instead of a byte or a few in each row; that made
    the cast 6-8% faster on the H200 (BENCHMARKS.md). ``dequantize_rowwise`` and
    ``scaled_mm`` take either layout; call ``s_row.contiguous()`` for a row-major copy.
    """
    name, mode = _check("quantize_both", x, fmt, block_size, scale_mode, backend)
    op = _quantize_both_impl if may_skip_dispatch(x) else QUANTIZE_BOTH
    q_row, s_row_buf, q_col_t, s_col_buf = op(x, name, block_size, mode, backend)
    return q_row, s_row_buf.t(), q_col_t, s_col_buf.t()
