"""The launcher of the MX cast kernel (:mod:`mx_kernels.cast_triton`): its tiles, one
cached launch configuration per cast kind and format, and the cast ops' outputs.

The ops launch through the plans of :mod:`mx_kernels.cast_plan`, made from
:func:`launch_args` and the ``empty_*`` layouts (the fake implementations of
:mod:`mx_kernels.cast` allocate the same); the inline fake-quantize overloads take
:func:`launch_args` too (:mod:`mx_kernels.inline_casts`). :func:`launch_cast` runs one
cast directly, with any tile: the tests and the benchmarks under ``tools/bench``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from mx_core import ElementFormat, get_format
from mx_kernels.backend import interpreter_enabled, persistent_programs
from mx_kernels.launch import KernelLauncher

__all__ = [
    "TILE_CONFIGS",
    "CastTile",
    "blocked_scale_numel",
    "empty_both",
    "empty_cast",
    "empty_cast_t",
    "launch_args",
    "launch_cast",
    "launch_config",
    "no_output",
]


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
    # The rowwise values and the columnwise codes: "both"'s tile, not yet swept.
    "fake_rowwise_codes_colwise": CastTile(
        128, 64, 4, k_first=True, max_regs=96, lanes_m=8, words=True
    ),
}
_INTERPRETER_TILE = CastTile(32, 64, 4)  # small: the interpreter's cost grows with tile size


def _tile(kind: str, block_size: int, tile: tuple[int, ...] | None, interpreter: bool) -> CastTile:
    t = CastTile(*(tile or (_INTERPRETER_TILE if interpreter else TILE_CONFIGS[kind])))
    block_m = max(t.block_m, 1 if kind.endswith("rowwise") else block_size)
    t = t._replace(block_m=block_m, block_k=max(t.block_k, block_size))
    if t.lanes_m and (block_size % t.lanes_m or t.block_m != t.warps * block_size):
        t = t._replace(lanes_m=0)  # the row permutation is only defined for this shape
    codes_t = ("colwise", "both", "fake_rowwise_codes_colwise")  # kinds storing x^T's codes
    if t.words and (t.lanes_m * 4 != block_size or kind not in codes_t):
        t = t._replace(words=False)
    return t


@functools.lru_cache(maxsize=512)
def launch_config(
    kind: str,
    fmt_name: str,
    block_size: int,
    scale_mode: str,
    tile: tuple[int, ...] | None,
    hw_round: bool,
    interpreter: bool,
    s_row_t: bool = False,
    blocked: bool = False,
) -> tuple[CastTile, KernelLauncher]:
    """The tile and the launcher (kernel constants bound) of one cast configuration:
    built once, since a cast's host time is measured against a kernel of a few to tens
    of microseconds (BENCHMARKS.md, 2026-12-03 'Host cost per op').

    Args:
        kind: a key of :data:`TILE_CONFIGS` (``"rowwise"``, ..., ``"fake_both"``,
            ``"fake_rowwise_codes_colwise"``: the rowwise values and columnwise codes).
        fmt_name, block_size, scale_mode: the format's canonical name, elements per
            scale, and the scale mode's value.
        tile: the fields of a :class:`CastTile` overriding the kind's, or None.
        hw_round: round with the GPU's fp8 conversion (else fp32 arithmetic).
        interpreter: TRITON_INTERPRET on a CPU tensor; it keys the cache, since it
            changes the default tile.
        s_row_t: the rowwise scales are column-major (strides (1, M)).
        blocked: the scales go out in cuBLAS's blocked layout (a kernel of its own, so
            the plain layouts' kernels are unchanged).
    Returns:
        ``(tile, launcher)``: the :class:`CastTile` fitted to the block size, and the
        :class:`~mx_kernels.launch.KernelLauncher` of ``mx_cast_kernel`` (5 tensors).
    """
    from mx_kernels.cast_triton import format_constants, mx_cast_kernel

    fmt = get_format(fmt_name)
    t = _tile(kind, block_size, tile, interpreter)
    constants = dict(
        BLOCK_M=t.block_m,
        BLOCK_K=t.block_k,
        **format_constants(fmt, block_size, scale_mode),
        HW_ROUND=hw_round,
        ROWWISE=kind.endswith(("rowwise", "both")) or kind == _MIXED,
        COLWISE=kind.endswith(("colwise", "both")),
        DEQ=kind.startswith("fake_"),
        DEQ_COL=kind.startswith("fake_") and kind != _MIXED,
        PERSISTENT=bool(t.programs_per_sm),
        STAGES=t.stages,
        K_FIRST=t.k_first,
        LANES_M=t.lanes_m,
        S_ROW_T=s_row_t,
        WORDS_T=t.words and not fmt.is_packed,
        BLOCKED=blocked,
        num_warps=t.warps,
        **({"maxnreg": t.max_regs} if t.max_regs else {}),
    )
    return t, KernelLauncher(mx_cast_kernel, constants, tensors=5)


@functools.cache
def no_output(device: torch.device) -> torch.Tensor:
    """A zero-size uint8 tensor passed for outputs a cast does not write.

    Args:
        device: the cast's device.
    Returns:
        The same empty uint8 tensor for every call on ``device`` (cached).
    """
    return torch.empty(0, dtype=torch.uint8, device=device)


_MIXED = "fake_rowwise_codes_colwise"
# (q_row given, q_col given, rowwise dequantized, columnwise dequantized) -> kind
_KINDS = {
    (True, False, False, False): "rowwise",
    (False, True, False, False): "colwise",
    (True, True, False, False): "both",
    (True, False, True, True): "fake_rowwise",
    (False, True, True, True): "fake_colwise",
    (True, True, True, True): "fake_both",
    (True, True, True, False): _MIXED,
}


def launch_cast(
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
    dequantized: bool | str = False,
    blocked: bool = False,
) -> None:
    """Run the Triton cast on a 2-D x; None outputs are skipped.

    Args:
        x2d: [M, K] fp32/bf16/fp16, any strides.
        fmt, block_size, scale_mode: the format, elements per scale (divides M for a
            columnwise cast, K for a rowwise one), and the scale mode's value.
        q_row, s_row: the rowwise codes [M, K] (fp4: [M, K // 2]) and E8M0 scales, or None.
        q_col, s_col: the columnwise codes [K, M] (fp4: [K, M // 2]) and scales
            [K, M // block_size], or None.
        tile, hw_round, dequantized, blocked: below.

    ``dequantized``: q_row and q_col receive the fake-quantized values instead (in their
    own dtype, both [M, K] row-major), s_row and s_col must be None; ``"rowwise"``: q_row
    alone does (s_row None), q_col and s_col get the columnwise codes and scales. ``s_row`` is
    row-major (any rank, [..., K // block_size]) or, 2-D, column-major (strides (1, M)).
    ``blocked`` (block_size 32): s_row and s_col are 1-D buffers of
    :func:`blocked_scale_numel` bytes that receive the scales in cuBLAS's blocked layout,
    padding included.

    ``tile`` (a :class:`CastTile` or the tuple of its fields) overrides TILE_CONFIGS;
    ``hw_round`` overrides the rounding path (default: the GPU's fp8 conversion on CUDA,
    fp32 arithmetic in the interpreter). Benchmarks sweep these; every choice is
    bit-exact where it runs. The ops launch through :mod:`mx_kernels.cast_plan` instead,
    with the same arguments, planned once per shape.
    """
    launcher, grid, ints = launch_args(
        x2d.shape, x2d.stride(), x2d.device, fmt, block_size, scale_mode,
        q_row, s_row, q_col, s_col, tile, hw_round, dequantized, blocked,
    )  # fmt: skip
    dummy = no_output(x2d.device)

    def u8(out, values: bool):
        return dummy if out is None else out if values else out.view(torch.uint8)

    row, col = bool(dequantized), dequantized is True
    launcher(grid, x2d, u8(q_row, row), u8(s_row, row), u8(q_col, col), u8(s_col, col), *ints)


def launch_args(
    shape,
    strides,
    device: torch.device,
    fmt: ElementFormat,
    block_size: int,
    scale_mode: str,
    q_row,
    s_row,
    q_col,
    s_col,
    tile: tuple[int, ...] | None = None,
    hw_round: bool | None = None,
    dequantized: bool | str = False,
    blocked: bool = False,
) -> tuple[KernelLauncher, tuple[int, ...], tuple[int, ...]]:
    """:func:`launch_cast`'s launcher, grid and int arguments for an x [M, K].

    Args:
        shape, strides: x's [M, K] and its strides, in elements.
        device: x's device.
        q_row, s_row, q_col, s_col: the outputs, only looked at for which are given and
            s_row's strides (meta tensors will do).
        fmt, block_size, scale_mode, tile, hw_round, dequantized, blocked: as
            :func:`launch_cast`.
    Returns:
        ``(launcher, grid, ints)``: the :func:`launch_config` launcher, its grid, and the
        kernel's ints ``(M, K, x strides, s_row strides, tiles per program)``.
    Raises:
        ValueError: ``dequantized`` not False, True or ``"rowwise"``; s_row (not
            blocked) neither row-major nor 2-D column-major
            (strides (1, M)).
    """  # fmt: skip
    m, k = shape
    if dequantized not in (False, True, "rowwise"):
        allowed = "False, True, 'rowwise'"
        raise ValueError(f"launch_args: dequantized={dequantized!r}; allowed {allowed}")
    deq = (bool(dequantized), dequantized is True)
    kind = _KINDS[(q_row is not None, q_col is not None, *deq)]
    cuda = device.type == "cuda"
    hw_round = cuda if hw_round is None else hw_round
    s_row_t = False  # rowwise scales row-major, or column-major (quantize_both's)
    s_row_strides = (0, 0)
    if s_row is not None and not blocked:
        if s_row.is_contiguous():
            s_row_strides = (k // block_size, 1)
        elif s_row.dim() == 2 and s_row.stride() == (1, m):
            s_row_t, s_row_strides = True, (1, m)
        else:
            raise ValueError(
                f"launch_args: s_row strides {s_row.stride()}: need row- or column-major"
            )
    t, launcher = launch_config(
        kind, fmt.name, block_size, scale_mode, None if tile is None else tuple(tile),
        hw_round, not cuda and interpreter_enabled(), s_row_t, blocked,
    )  # fmt: skip
    # Blocked scales: the grid covers x padded to [ceil128(M), ceil128(K)], so that the
    # kernel writes the layout's padding too (mx_cast_kernel).
    m_grid, k_grid = (-(-m // 128) * 128, -(-k // 128) * 128) if blocked else (m, k)
    grid = (-(-m_grid // t.block_m), -(-k_grid // t.block_k))
    tiles, tiles_per_program = grid[0] * grid[1], 1
    if t.programs_per_sm:
        grid = (min(tiles, persistent_programs(device, t.programs_per_sm)),)
        tiles_per_program = -(-tiles // grid[0])
    elif t.k_first:
        grid = (tiles,)
    return launcher, grid, (m, k, *strides, *s_row_strides, tiles_per_program)


def blocked_scale_numel(rows, cols):
    """Bytes of a [rows, cols] scale matrix in cuBLAS's blocked layout.

    Args:
        rows, cols: the scale matrix's shape (ints or torch.compile's symbolic sizes).
    Returns:
        ``ceil128(rows) * ceil4(cols)``: the size of
        :func:`mx_kernels.swizzle.swizzled_shape`, in arithmetic symbolic sizes go through.
    """
    return (rows + 127) // 128 * 128 * ((cols + 3) // 4 * 4)


def _scale(rows, cols, blocked: bool, device) -> torch.Tensor:
    shape = (blocked_scale_numel(rows, cols),) if blocked else (rows, cols)
    return torch.empty(shape, dtype=torch.float8_e8m0fnu, device=device)


def empty_cast(
    shape, fmt: ElementFormat, block_size: int, device, blocked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised outputs of a rowwise cast.

    Args:
        shape: x's shape [..., K].
        fmt, block_size: the format and elements per scale.
        device: where to allocate (``"meta"`` will do).
        blocked: the scale in cuBLAS's blocked layout (2-D shape [M, K] only).
    Returns:
        ``(qdata, scale)``, contiguous: qdata [..., K] (fp4: [..., K // 2]) of the format's
        storage dtype; scale [..., K // block_size] float8_e8m0fnu, or blocked the 1-D
        :func:`blocked_scale_numel` bytes of [M, K // block_size].
    """
    *lead, k = shape
    qk = k // 2 if fmt.is_packed else k
    qdata = torch.empty(*lead, qk, dtype=fmt.storage_dtype, device=device)
    if blocked:
        return qdata, _scale(lead[0], k // block_size, True, device)
    scale = torch.empty(*lead, k // block_size, dtype=torch.float8_e8m0fnu, device=device)
    return qdata, scale


def empty_cast_t(
    x_shape, fmt: ElementFormat, block_size: int, device, blocked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised outputs of the columnwise op for a 2-D x of ``x_shape`` [M, K].
    Arguments as :func:`empty_cast`.

    The ops return the scales' buffer and the public functions its transpose, scale_t:
    the ops' outputs stay contiguous, since with a transposed output Inductor's generated
    code asserted contiguous strides once shapes turned dynamic (torch 2.13).

    Returns:
        ``(qdata_t, scale buffer)``: qdata_t [K, M] (fp4: [K, M // 2]) and the scales'
        buffer [M // block_size, K], both contiguous; ``blocked``: the scales are instead
        the 1-D blocked layout of x^T's [K, M // block_size].
    """
    m, k = x_shape
    qdata_t = torch.empty(k, m // 2 if fmt.is_packed else m, dtype=fmt.storage_dtype, device=device)
    if blocked:
        return qdata_t, _scale(k, m // block_size, True, device)
    return qdata_t, _scale(m // block_size, k, False, device)


def empty_both(
    x_shape, fmt: ElementFormat, block_size: int, device, blocked: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised outputs of the both op for a 2-D x of ``x_shape`` [M, K].
    Arguments as :func:`empty_cast`.

    Returns:
        q_row [M, K] (fp4: [M, K // 2]), the rowwise scales' buffer [K // block_size, M]
        (the public s_row is its transpose), then :func:`empty_cast_t`'s two; all
        contiguous. ``blocked``: both scales are 1-D blocked layouts, of
        [M, K // block_size] and of [K, M // block_size].
    """
    m, k = x_shape
    q_row = torch.empty(m, k // 2 if fmt.is_packed else k, dtype=fmt.storage_dtype, device=device)
    if blocked:
        s_row = _scale(m, k // block_size, True, device)
    else:
        s_row = _scale(k // block_size, m, False, device)
    return q_row, s_row, *empty_cast_t(x_shape, fmt, block_size, device, blocked)


# The names tools/bench imported before these were public; kept until it imports the
# public ones.
_empty_cast, _empty_cast_t, _empty_both, _launch = empty_cast, empty_cast_t, empty_both, launch_cast
