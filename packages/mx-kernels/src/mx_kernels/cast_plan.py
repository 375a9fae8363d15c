"""Plans of the cast calls: everything a cast derives from its arguments, built once per
distinct (op, layout, shape, strides, dtype, device, format, block size, scale mode,
backend, scale layout), so that a call is a dict lookup, its output allocations and the
kernel launch.

A cast's host time is measured against kernels of a few microseconds, and each Python
step of the checks, the backend choice, the output shapes and the launch arguments
costs a fraction of a microsecond to a few (BENCHMARKS.md, 'Host cost per op'). A plan
is made by the full checks, which raise naming the argument, so a cached plan stands
for arguments that passed them. What may change between calls of equal keys is read on
every call: whether the backend choice still has to be logged (a set lookup), Triton's
launch hooks, ``MX_KERNELS_CACHED_LAUNCH`` and ``MX_KERNELS_CHECK_LAUNCH``
(:mod:`mx_kernels.launch`), and, off CUDA, ``TRITON_INTERPRET`` (part of the key).

Layouts: an op (``torch.ops.mx.*``) returns contiguous buffers; the public functions
return some scales transposed (:mod:`mx_kernels.cast`), so their plans allocate those
column-major directly (one ``torch.empty_strided`` each, no view afterwards).

Scale layouts (:data:`SCALE_LAYOUTS`): ``"plain"``, the layouts above; ``"blocked"``, the 1-D
bytes of cuBLAS's (:mod:`mx_kernels.swizzle`), which the kernel writes, the reference swizzles.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import torch

import mx_core
from mx_core import ElementFormat, get_format, get_scale_mode
from mx_kernels import backend as _backend
from mx_kernels.backend import (
    BACKENDS,
    TRITON_BLOCK_SIZES,
    choose_backend,
    interpreter_enabled,
    log_choice,
)
from mx_kernels.cast_launch import empty_both, empty_cast, empty_cast_t, launch_args, no_output
from mx_kernels.launch import PreparedLaunch
from mx_kernels.swizzle import swizzle_scales

__all__ = [
    "CAST_ARGS",
    "DIMS",
    "MAX_PLANS",
    "REFERENCES",
    "SCALE_LAYOUTS",
    "CastPlan",
    "blocked_layout",
    "check_args",
    "check_scale_layout",
    "choose",
    "clear_plans",
    "plan_for",
    "public_layout",
]

CAST_ARGS = "(Tensor x, str fmt, SymInt block_size, str scale_mode, str backend)"
"""The arguments of every cast op's schema (:mod:`mx_kernels.cast`,
:mod:`mx_kernels.fake_quant`), which the plans take in this order."""

# op -> the dims its blocks run along (-1: the last dim, any rank; 0: dim 0 of 2-D x)
DIMS: dict[str, tuple[int, ...]] = {
    "quantize_rowwise": (-1,),
    "quantize_colwise": (0,),
    "quantize_both": (-1, 0),
    "fake_quantize_rowwise": (-1,),
    "fake_quantize_colwise": (0,),
    "fake_quantize_both": (-1, 0),
    "fake_quantize_rowwise_quantize_colwise": (-1, 0),
}
# op -> mx-core's reference, (x, fmt, block_size, scale_mode) -> the op's outputs; the
# op modules (cast, fake_quant) register theirs.
REFERENCES: dict[str, Callable] = {}
SCALE_LAYOUTS: tuple[str, ...] = ("plain", "blocked")
"""The casts' ``scale_layout`` values (:func:`check_scale_layout`)."""
MAX_PLANS = 4096  # distinct call signatures kept before starting afresh
_PLANS: dict[tuple, CastPlan] = {}


def clear_plans() -> None:
    """Drop every plan made so far: the next call of each signature plans afresh (for
    tests that change what a plan captured, such as the launch path)."""
    _PLANS.clear()


def public_layout(outs):
    """quantize_colwise's, quantize_both's or fake_quantize_rowwise_quantize_colwise's
    public outputs from its op's.

    Args:
        outs: the op's outputs (2, 3 or 4 tensors, each scale a contiguous buffer).
    Returns:
        ``outs`` with each scale buffer transposed: a column-major view, no copy.
    """
    if len(outs) == 2:  # quantize_colwise: (qdata_t, scale buffer [M // bs, K])
        return outs[0], outs[1].t()
    if len(outs) == 3:  # (rowwise values, qdata_t, scale buffer [M // bs, K])
        return outs[0], outs[1], outs[2].t()
    q_row, s_row_buf, q_col, s_col_buf = outs  # quantize_both
    return q_row, s_row_buf.t(), q_col, s_col_buf.t()


def blocked_layout(op: str, outs):
    """The reference of ``scale_layout="blocked"``: a quantize op's outputs, swizzled.

    Args:
        op, outs: a quantize op's name and its plain outputs (as the op returns them).
    Returns:
        ``outs``, each scale as the 1-D bytes of :func:`~mx_kernels.swizzle.swizzle_scales`.
    """
    if op == "quantize_rowwise":  # (qdata, scale [M, K // bs])
        return outs[0], swizzle_scales(outs[1]).view(-1)
    if op == "quantize_colwise":  # (qdata_t, scale buffer [M // bs, K] of x^T's [K, M // bs])
        return outs[0], swizzle_scales(outs[1].t()).view(-1)
    q_row, s_row_buf, q_col, s_col_buf = outs  # quantize_both: both buffers transposed
    return (
        q_row,
        swizzle_scales(s_row_buf.t()).view(-1),
        q_col,
        swizzle_scales(s_col_buf.t()).view(-1),
    )


_PUBLIC_VIEWS: dict[str, Callable] = {
    "quantize_colwise": public_layout,
    "quantize_both": public_layout,
    "fake_quantize_rowwise_quantize_colwise": public_layout,
}


def plan_for(
    op: str, public: bool, x: torch.Tensor, fmt, block_size, scale_mode, backend,
    scale_layout="plain",
):  # fmt: skip
    """The plan of cast ``op`` for these arguments, made (by the checks) on their first call.

    Args:
        op: a key of :data:`DIMS`.
        public: the public function's layout and checks (:func:`check_args`); otherwise
            the op's (its body, given canonical names).
        x, fmt, block_size, scale_mode, backend: as :data:`CAST_ARGS`.
        scale_layout: one of :data:`SCALE_LAYOUTS` (quantize ops only).
    Returns:
        The :class:`CastPlan`, cached per signature; calling it on x runs the cast.
    """
    key = (
        op, public, x.shape, x.stride(), x.dtype, x.device, fmt, block_size, scale_mode,
        backend, x.is_cuda or interpreter_enabled(), scale_layout,
    )  # fmt: skip
    args = (op, public, x, fmt, block_size, scale_mode, backend, scale_layout)
    try:
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable argument: the checks name it
        return _plan(*args)
    if plan is None:
        plan = _plan(*args)
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def check_args(
    fn: str, x, fmt, block_size, scale_mode, backend, scale_layout="plain"
) -> tuple[str, str]:
    """Validate the public functions' arguments that the op bodies do not see as
    tensors (the shape checks run in the op bodies, :func:`choose`, on real tensors).

    Args:
        fn: the public function's name, for messages.
        x, fmt, block_size, scale_mode, backend, scale_layout: its arguments.
    Returns:
        The canonical names of the format and of the scale mode.
    Raises:
        TypeError: x not a tensor, block_size not an int (a bool included), fmt of another type.
        ValueError: fmt, scale_mode or backend unknown; scale_layout (:func:`check_scale_layout`).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{fn}: block_size must be an int, got {type(block_size).__name__}")
    check_scale_layout(fn, scale_layout, block_size, x.shape)
    names = _names.__wrapped__ if torch.compiler.is_compiling() else _names  # dynamo: no caches
    try:
        try:
            return names(fmt, scale_mode, backend)
        except TypeError:  # unhashable arguments too get the checks' own error
            return _names.__wrapped__(fmt, scale_mode, backend)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: {e}") from None


def check_scale_layout(fn: str, scale_layout, block_size, shape) -> None:
    """Check a cast's ``scale_layout``: ``"blocked"`` is the layout cuBLAS's MX GEMM
    reads, for 2-D operands with blocks of 32.

    Args:
        fn: the cast's name, for messages.
        scale_layout, block_size, shape: the cast's scale layout, block size and x's shape.
    Raises:
        ValueError: ``scale_layout`` not in :data:`SCALE_LAYOUTS`; ``"blocked"`` for a fake
            quantization (``fn`` ``fake_*``), a block_size other than 32 or an x not 2-D.
    """
    if scale_layout == "plain":
        return
    if scale_layout != "blocked":
        allowed = ", ".join(repr(s) for s in SCALE_LAYOUTS)
        raise ValueError(f"{fn}: scale_layout={scale_layout!r} is not one of {allowed}")
    if fn.startswith("fake_"):
        raise ValueError(f"{fn}: scale_layout='blocked' is for casts that return scales")
    if block_size != 32:
        raise ValueError(
            f"{fn}: scale_layout='blocked' needs block_size=32 (the block of cuBLAS's MX "
            f"GEMM), got block_size={block_size}"
        )
    if len(shape) != 2:
        raise ValueError(
            f"{fn}: scale_layout='blocked' needs a 2-D x [M, K] (a GEMM operand), got shape "
            f"{tuple(shape)}"
        )


@functools.lru_cache(maxsize=256)
def _names(fmt, scale_mode, backend) -> tuple[str, str]:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    return get_format(fmt).name, get_scale_mode(scale_mode).value


def choose(op: str, backend: str, x: torch.Tensor, block_size: int, dims: tuple) -> tuple[str, str]:
    """The implementation an op body runs and why, after the checks of x's shape: here, not
    in the public functions, as op bodies see the real tensors (DTensor's local shards,
    torch.compile's run-time ones); only plans come here, so they run once per signature.

    Args:
        op, backend: the op's name and one of :data:`~mx_kernels.backend.BACKENDS`.
        x, block_size: the tensor the op body casts, and elements per scale.
        dims: the dims its blocks run along (:data:`DIMS`).
    Returns:
        ``(impl, why)``, :func:`~mx_kernels.backend.choose_backend`'s choice.
    Raises:
        ValueError: a columnwise op's x not 2-D.
        TypeError, ValueError, RuntimeError: as :func:`mx_core.check_quantize_args` (each
            blocked dim) and :func:`~mx_kernels.backend.choose_backend`.
    """
    if dims != (-1,) and x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    for dim in dims:
        mx_core.check_quantize_args(x, block_size, dim, fn=op)
    gap = None
    if block_size not in TRITON_BLOCK_SIZES:
        gap = f"block_size={block_size} has no Triton cast (Triton: {TRITON_BLOCK_SIZES})"
    return choose_backend(op, backend, x.device, gap)


class CastPlan:
    """One cast call signature's work: log the backend choice (once per process), then
    run the reference, or allocate the outputs (``specs``: size, strides, dtype each;
    ``allocs``: one ``torch.empty_strided`` each) and launch the kernel (``launch``;
    ``slots`` picks its four output arguments from the outputs and the zero-size
    stand-in appended to them; ``result`` what the call returns). ``prepare``, if set,
    makes the x that the kernel reads (a copy)."""

    __slots__ = ("logs", "_logged", "prepare", "specs", "allocs", "dummy", "launch", "slots",
                 "result", "_run")  # fmt: skip

    def __init__(self, logs: tuple, reference: Callable | None = None) -> None:
        self.logs = logs  # log_choice's arguments, in order
        self._logged = frozenset(logs)
        self.prepare = None
        self._run = reference  # the reference, or the Triton plans' own (_triton_plan)

    def __call__(self, x: torch.Tensor):
        if not self._logged <= _backend.LOGGED:
            for key in self.logs:
                log_choice(*key)
        return self._run(x)

    def _allocate_and_launch(self, x: torch.Tensor):
        """Any Triton cast: x's copy if planned, the outputs, the launch."""
        if self.prepare is not None:
            x = self.prepare(x)
        outs = [alloc() for alloc in self.allocs]
        outs.append(self.dummy)
        self.launch(x, *self.slots(outs))
        return self.result(outs)


def _fake_quantize_both_run(plan: CastPlan) -> Callable:
    """:meth:`CastPlan._allocate_and_launch` of ``fake_quantize_both`` (no copy of x)
    unrolled: the cast MXLinear runs three times a layer call, where the generic loop
    over outputs and slots costs about a microsecond of host time."""
    (row_alloc, col_alloc), launch, dummy = plan.allocs, plan.launch, plan.dummy

    def run(x: torch.Tensor):
        row, col = row_alloc(), col_alloc()
        launch(x, row, dummy, col, dummy)  # q_row, s_row, q_col, s_col
        return row, col

    return run


def _op_outputs(op: str, shape, f: ElementFormat, block_size: int, dtype, blocked: bool):
    """The op's outputs as meta tensors, and for each of the kernel's outputs (q_row,
    s_row, q_col, s_col) which of them it writes there (None: none)."""
    if op == "quantize_rowwise":
        return empty_cast(shape, f, block_size, "meta", blocked), (0, 1, None, None)
    if op == "quantize_colwise":
        return empty_cast_t(shape, f, block_size, "meta", blocked), (None, None, 0, 1)
    if op == "quantize_both":
        return empty_both(shape, f, block_size, "meta", blocked), (0, 1, 2, 3)
    row = torch.empty(shape, dtype=dtype, device="meta")  # fake quantization: x's shape
    if op == "fake_quantize_rowwise":
        return (row,), (0, None, None, None)
    if op == "fake_quantize_colwise":
        return (row,), (None, None, 0, None)
    if op == "fake_quantize_rowwise_quantize_colwise":
        return (row, *empty_cast_t(shape, f, block_size, "meta", blocked)), (0, None, 1, 2)
    return (row, torch.empty_like(row)), (0, None, 1, None)


def _reshape_2d(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _plan(op: str, public: bool, x: torch.Tensor, fmt, block_size, scale_mode, backend, layout):
    if public:
        fmt, scale_mode = check_args(op, x, fmt, block_size, scale_mode, backend, layout)
    else:
        check_scale_layout(op, layout, block_size, x.shape)
    f = get_format(fmt)
    impl, why = choose(op, backend, x, block_size, DIMS[op])
    logs = [(op, impl, x.device.type, why)]
    blocked = layout == "blocked"
    view = _PUBLIC_VIEWS.get(op) if public and not blocked else None  # blocked: flat
    if impl == "reference":
        reference = REFERENCES[op]

        def run_reference(x):
            out = reference(x, f, block_size, scale_mode)
            if blocked:
                return blocked_layout(op, out)
            return out if view is None else view(out)

        return CastPlan(tuple(logs), run_reference)
    return _triton_plan(op, x, f, block_size, scale_mode, logs, view, blocked)


def _triton_plan(
    op, x, f: ElementFormat, block_size: int, scale_mode: str, logs: list, view, blocked: bool
):
    """The Triton cast's plan: the op's outputs laid out on meta tensors (the same
    functions allocate them in the fake implementations), the public views of them,
    and the launch arguments of :func:`mx_kernels.cast_launch.launch_args` for them."""
    device, shape = x.device, x.shape
    prepare = None
    if op.endswith("rowwise") and x.dim() != 2:
        k = shape[-1]
        try:  # the kernel reads x itself, as the [M, K] view it has
            x2d = x.view(-1, k)
            m, strides = x2d.shape[0], x2d.stride()
        except RuntimeError:  # not viewable: a copy, as reshape makes (or its error)
            m = torch.empty(shape, device="meta").reshape(-1, k).shape[0]
            prepare, strides = _reshape_2d, (k, 1)
    else:
        (m, k), strides = shape, x.stride()
    if op == "quantize_both" and f.is_packed and strides[1] != 1:
        # On the H200 (triton 3.6) the fused cast wrote wrong columnwise scales and codes
        # for fp4 from an fp32 x strided along K (x.t() of a contiguous tensor), while
        # from a contiguous x it was exact (BENCHMARKS.md, 2026-12-03 'Casts: word
        # stores'; reproducer: tools/bench/repro_both_fp4.py). Until that is understood,
        # it reads a copy.
        logs.append((op, "triton", device.type, "fp4, x strided along K: copy"))
        prepare, strides = operator.methodcaller("contiguous"), (k, 1)
    outs, slot_idx = _op_outputs(op, shape, f, block_size, x.dtype, blocked)
    kernel_outs = [None if i is None else outs[i] for i in slot_idx]
    if op == "quantize_both" and not blocked:
        kernel_outs[1] = outs[1].t()  # written through the scale buffer's transpose
    fake = op.startswith("fake_")
    codes_col = op == "fake_quantize_rowwise_quantize_colwise"  # values rowwise, codes colwise
    launcher, grid, ints = launch_args(
        (m, k), tuple(strides), device, f, block_size, scale_mode, *kernel_outs,
        dequantized="rowwise" if codes_col else fake, blocked=blocked,
    )  # fmt: skip
    returned = outs if view is None else view(outs)
    # the dtype each kernel output is viewed as: uint8 for codes and scales
    views = [None if fake and (slot < 2 or not codes_col) else torch.uint8 for slot in range(4)]
    plan = CastPlan(tuple(logs))
    plan.prepare = prepare
    plan.specs = tuple((tuple(o.shape), o.stride(), o.dtype) for o in returned)
    plan.allocs = tuple(
        functools.partial(torch.empty_strided, size, stride, dtype=dtype, device=device)
        for size, stride, dtype in plan.specs
    )
    plan.dummy = no_output(device)
    plan.launch = PreparedLaunch(
        launcher, grid, ints, device.type,
        (None, *(None if i is None else views[slot] for slot, i in enumerate(slot_idx))),
    )  # fmt: skip
    dummy = len(outs)  # its index in the list of outputs
    plan.slots = operator.itemgetter(*(dummy if i is None else i for i in slot_idx))
    plan.result = operator.itemgetter(*range(len(outs)))
    plan._run = plan._allocate_and_launch
    if op == "fake_quantize_both" and prepare is None:
        plan._run = _fake_quantize_both_run(plan)
    return plan
