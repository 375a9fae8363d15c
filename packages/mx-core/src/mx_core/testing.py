"""The MX semantics table: hand-derived cases that every cast implementation must meet.

Each case is one 32-element block whose element 0 holds the block's largest magnitude
(``value``); the other elements are ``value * c_k`` with fixed ``|c_k| < 1`` (or fixed
finite fillers for non-finite and zero values). Expected are the unbiased E8M0 exponent
(``None`` for the NaN byte 255) and the decoded element code of element 0 (the qdata
value before scaling). Expectations were worked out by hand from the formulas in
:mod:`mx_core.scale`; the arithmetic is in each case's ``why``.

Kernel packages test bit-exactness against :func:`mx_core.quantize` on
:func:`semantic_inputs` and check these expectations through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mx_core.oracle import oracle_quantize
from mx_core.scale import ScaleMode, top_exponent

__all__ = [
    "SEMANTIC_CASES",
    "SemanticCase",
    "assert_same_bits",
    "oracle_quantize",
    "semantic_block",
    "semantic_inputs",
    "sqnr_db",
]

BLOCK = 32
_NAN, _INF = float("nan"), float("inf")
_FP32_MAX = 3.4028234663852886e38
_BF16_MAX = 3.3895313892515355e38
_FP16_MAX = 65504.0


@dataclass(frozen=True, kw_only=True)
class SemanticCase:
    """One block and what each scale mode must make of it."""

    fmt: str
    """Element format."""
    value: float
    """Element 0, the block's amax carrier."""
    dtype: torch.dtype
    """Input dtype (``value`` is exact in it)."""
    expected: dict[ScaleMode, tuple[int | None, float]]
    """Per mode: (unbiased exponent or None for NaN, decoded code of element 0)."""
    why: str = ""
    """The hand arithmetic."""

    @property
    def name(self) -> str:
        return f"{self.fmt}-{self.value!r}-{str(self.dtype).removeprefix('torch.')}"


def _all(e: int | None, elem: float) -> dict[ScaleMode, tuple[int | None, float]]:
    return {m: (e, elem) for m in ScaleMode}


def _modes(floor, ceil, even, rceil) -> dict[ScaleMode, tuple[int | None, float]]:
    return {
        ScaleMode.FLOOR: floor,
        ScaleMode.CEIL: ceil,
        ScaleMode.EVEN: even,
        ScaleMode.RCEIL: rceil,
    }


def _case(fmt, value, expected, why="", dtype=torch.float32) -> SemanticCase:
    return SemanticCase(fmt=fmt, value=value, dtype=dtype, expected=expected, why=why)


_E4 = "fp8_e4m3"
_CASES = [
    # fp8_e4m3: emax 8, max 448 = 1.75 * 2^8; [128, 256) spacing 16, [256, 448] spacing 32.
    _case(_E4, 448.0, _modes((0, 448.0), (1, 224.0), (0, 448.0), (0, 448.0)), "exactly max"),
    _case(
        _E4,
        449.0,
        _modes((0, 448.0), (1, 224.0), (0, 448.0), (1, 224.0)),
        "floor saturates 449; rceil 449/448 > 1 -> e=1, 224.5 -> 224",
    ),
    _case(
        _E4,
        464.0,
        _modes((0, 448.0), (1, 224.0), (0, 448.0), (1, 224.0)),
        "464=1.1101b*2^8: even keeps 1.110 (tie to even); 232 ties to 224",
    ),
    _case(
        _E4,
        480.0,
        _modes((0, 448.0), (1, 240.0), (0, 448.0), (1, 240.0)),
        "480=1.111b*2^8 fits 3 bits (no carry) but saturates at e=0",
    ),
    _case(
        _E4,
        496.0,
        _modes((0, 448.0), (1, 256.0), (1, 256.0), (1, 256.0)),
        "496=1.1111b*2^8: even rounds up with carry -> e=1; 248 ties to 256",
    ),
    _case(_E4, -449.0, _modes((0, -448.0), (1, -224.0), (0, -448.0), (1, -224.0)), "sign"),
    _case(_E4, 1.0, _all(-8, 256.0), "1 = 2^0 -> e = 0 - 8 in every mode"),
    _case(
        _E4,
        1.8,
        _modes((-8, 448.0), (-7, 224.0), (-8, 448.0), (-7, 224.0)),
        "mantissa 1.8 > 1.75: rceil/ceil e=-7, 230.4 -> 224; floor 460.8 saturates",
    ),
    _case(_E4, 2.0**-120, _all(-127, 128.0), "e=-128 clamps to -127 (byte 0): 2^-120*2^127"),
    _case(_E4, 2.0**-140, _all(-127, 0.0), "fp32 subnormal: byte 0, 2^-13 rounds to 0"),
    _case(_E4, 0.0, _all(-127, 0.0), "zero block: byte 0, data 0"),
    _case(_E4, _NAN, _all(None, _NAN), "NaN block: byte 255, data NaN"),
    _case(_E4, _INF, _all(None, _NAN), "+Inf block: byte 255, data NaN"),
    _case(_E4, -_INF, _all(None, _NAN), "-Inf block: byte 255, data NaN"),
    # The top of the input dtype (mx_core.scale): where amax rounded to mbits bits reaches
    # 2^(T+1), every mode takes the floor exponent T - emax and the element saturates.
    _case(
        _E4,
        _FP32_MAX,
        _all(119, 448.0),
        "(2-2^-23)*2^127: floor 511.99 saturates; ceil/even/rceil would take e=120, where "
        "255.99 rounds to 256 and decodes to 2^128 (inf), so they saturate at e=119 too",
    ),
    _case(
        _E4,
        _BF16_MAX,
        _all(119, 448.0),
        "(2-2^-7)*2^127: e=120 would round 255 to 256 (2^128, inf in bf16): 510 saturates",
        torch.bfloat16,
    ),
    _case(
        _E4,
        _FP16_MAX,
        _all(7, 448.0),
        "65504=(2-2^-10)*2^15: e=8 would round 255.875 to 256 (2^16, inf in fp16); T=15 "
        "gives e=7 and 511.75 saturates",
        torch.float16,
    ),
    _case(
        _E4,
        1.9375 * 2.0**127,
        _all(119, 448.0),
        "1.1111b*2^127 rounds to 2^128 at 3 bits: rceil's 248 would tie to 256; 496 saturates",
    ),
    _case(
        _E4,
        1.875 * 2.0**127,
        _modes((119, 448.0), (120, 240.0), (119, 448.0), (120, 240.0)),
        "1.111b*2^127 stays below 2^128 at 3 bits: ceil/rceil keep e=120 (240*2^120 is finite)",
    ),
    _case(_E4, 2.0**127, _all(119, 256.0), "2^127 is exact: e=119 in every mode"),
    _case(
        _E4,
        61440.0,
        _modes((7, 448.0), (8, 240.0), (7, 448.0), (8, 240.0)),
        "1.111b*2^15 in fp16: 240*2^8 = 61440 is finite, nothing saturates but floor/even",
        torch.float16,
    ),
    _case(
        _E4,
        63488.0,
        _all(7, 448.0),
        "1.1111b*2^15 in fp16 rounds to 2^16 at 3 bits: e=7, 496 saturates",
        torch.float16,
    ),
    # fp8_e5m2: emax 15, max 57344 = 1.75 * 2^15; [16384, 32768) spacing 4096.
    _case(
        "fp8_e5m2",
        57344.0,
        _modes((0, 57344.0), (1, 28672.0), (0, 57344.0), (0, 57344.0)),
        "exactly max",
    ),
    _case(
        "fp8_e5m2",
        61440.0,
        _modes((0, 57344.0), (1, 32768.0), (1, 32768.0), (1, 32768.0)),
        "1.111b*2^15: even carries; 30720 ties to 32768",
    ),
    _case("fp8_e5m2", _INF, _all(None, _NAN), "Inf block"),
    _case(
        "fp8_e5m2",
        61440.0,
        _all(0, 57344.0),
        "1.111b*2^15 in fp16 rounds to 2^16 at 2 bits: e=1 would give 32768*2 (inf in fp16)",
        torch.float16,
    ),
    _case(
        "fp8_e5m2",
        _FP32_MAX,
        _all(112, 57344.0),
        "at 2 bits amax rounds to 2^128: e=127-15, 65535.99 saturates",
    ),
    _case(
        "fp8_e5m2",
        _FP16_MAX,
        _all(0, 57344.0),
        "65504 rounds to 2^16 at 2 bits: e=15-15, 65504 saturates",
        torch.float16,
    ),
    # fp6_e2m3: emax 2, max 7.5 = 1.875 * 4; [2, 4) spacing 0.25.
    _case("fp6_e2m3", 7.5, _modes((0, 7.5), (1, 3.75), (0, 7.5), (0, 7.5)), "exactly max"),
    _case(
        "fp6_e2m3",
        7.75,
        _modes((0, 7.5), (1, 4.0), (1, 4.0), (1, 4.0)),
        "1.1111b*4: even carries; 3.875 ties to 4",
    ),
    _case("fp6_e2m3", _NAN, _all(None, 0.0), "NaN block: byte 255, codes 0 (no NaN code)"),
    _case("fp6_e2m3", _FP32_MAX, _all(125, 7.5), "e=127-2: 7.99 saturates"),
    # fp6_e3m2: emax 4, max 28 = 1.75 * 16; [8, 16) spacing 2.
    _case("fp6_e3m2", 28.0, _modes((0, 28.0), (1, 14.0), (0, 28.0), (0, 28.0)), "exactly max"),
    _case(
        "fp6_e3m2",
        30.0,
        _modes((0, 28.0), (1, 16.0), (1, 16.0), (1, 16.0)),
        "1.111b*16: even carries; 15 ties to 16",
    ),
    _case("fp6_e3m2", _FP32_MAX, _all(123, 28.0), "e=127-4: 31.99 saturates"),
    # fp4_e2m1: emax 2, max 6 = 1.5 * 4; grid 0, .5, 1, 1.5, 2, 3, 4, 6.
    _case("fp4_e2m1", 6.0, _modes((0, 6.0), (1, 3.0), (0, 6.0), (0, 6.0)), "exactly max"),
    _case(
        "fp4_e2m1",
        6.5,
        _modes((0, 6.0), (1, 3.0), (0, 6.0), (1, 3.0)),
        "1.101b*4: even keeps 1.1; 3.25 -> 3",
    ),
    _case(
        "fp4_e2m1",
        7.0,
        _modes((0, 6.0), (1, 4.0), (1, 4.0), (1, 4.0)),
        "1.11b*4: even ties up with carry; 3.5 ties to 4",
    ),
    _case("fp4_e2m1", 7.5, _modes((0, 6.0), (1, 4.0), (1, 4.0), (1, 4.0)), "3.75 -> 4"),
    _case("fp4_e2m1", 8.0, _all(1, 4.0), "2^3: e = 3 - 2 in every mode"),
    _case("fp4_e2m1", -_INF, _all(None, 0.0), "-Inf block: byte 255, codes 0"),
    _case("fp4_e2m1", -_FP32_MAX, _all(125, -6.0), "e=127-2: -7.99 saturates to -6"),
    _case(
        "fp4_e2m1",
        _BF16_MAX,
        _all(125, 6.0),
        "bf16 max rounds to 2^128 at 1 bit",
        torch.bfloat16,
    ),
    _case(
        "fp4_e2m1",
        _FP16_MAX,
        _all(13, 6.0),
        "fp16 max rounds to 2^16 at 1 bit: e=15-2",
        torch.float16,
    ),
    _case(
        "fp4_e2m1",
        1.5 * 2.0**127,
        _modes((125, 6.0), (126, 3.0), (125, 6.0), (125, 6.0)),
        "1.1b*2^127 is exact at 1 bit: ceil keeps e=126 (3*2^126 is finite)",
    ),
]


def _exact_in(value: float, dtype: torch.dtype) -> bool:
    if math.isnan(value) or math.isinf(value):
        return True
    return torch.tensor(value, dtype=torch.float64).to(dtype).item() == value


def _with_other_dtypes(cases: list[SemanticCase]) -> list[SemanticCase]:
    """Repeat each fp32 case in bf16 and fp16 where its value is exact there and below
    the dtype's top binade (whose saturation depends on the dtype: its own cases)."""
    out = list(cases)
    for c in cases:
        if c.dtype != torch.float32:
            continue
        for dtype in (torch.bfloat16, torch.float16):
            below_top = not math.isfinite(c.value) or abs(c.value) < 2.0 ** top_exponent(dtype)
            if _exact_in(c.value, dtype) and below_top:
                out.append(
                    SemanticCase(
                        fmt=c.fmt, value=c.value, dtype=dtype, expected=c.expected, why=c.why
                    )
                )
    return out


SEMANTIC_CASES: tuple[SemanticCase, ...] = tuple(_with_other_dtypes(_CASES))
"""Every case, in fp32 and, where the value is exact, also in bf16 and fp16."""


def semantic_block(case: SemanticCase) -> torch.Tensor:
    """The case's input block: element 0 is ``case.value``, the others smaller.

    Args:
        case: one of :data:`SEMANTIC_CASES`.

    Returns:
        [32] in ``case.dtype``.
    """
    c = torch.tensor([((k * 7) % 31 - 15) / 16 for k in range(1, BLOCK)], dtype=torch.float64)
    v = case.value
    if v == 0:
        rest = torch.zeros(BLOCK - 1, dtype=torch.float64)
    elif math.isfinite(v):
        rest = c * v
    else:
        rest = c
    block = torch.cat([torch.tensor([v], dtype=torch.float64), rest])
    return block.to(case.dtype)


def semantic_inputs(fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """All of ``fmt``'s cases in ``dtype`` stacked as rows.

    Args:
        fmt: an element format name.
        dtype: the input dtype of the cases taken.

    Returns:
        [n_cases, 32] in ``dtype`` (n_cases may be 0).
    """
    rows = [semantic_block(c) for c in SEMANTIC_CASES if c.fmt == fmt and c.dtype == dtype]
    if not rows:
        return torch.empty(0, BLOCK, dtype=dtype)
    return torch.stack(rows)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Assert equal dtype, shape and bit patterns (signed zeros included), except that
    NaNs only need to be NaN: their payloads may differ between implementations.

    Args:
        got: the tensor under test.
        want: the expected tensor.

    Raises:
        AssertionError: they differ.
    """
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    ok = ~want.isnan()
    assert torch.equal(got[ok].view(bits), want[ok].view(bits))


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 20 log10(||ref|| / ||ref - approx||).

    Args:
        reference: the exact values.
        approx: their approximation, same shape.

    Returns:
        dB as a float (``math.inf`` where they are equal).
    """
    ref = reference.double()
    noise = (ref - approx.double()).norm()
    if noise == 0:
        return math.inf
    return (20 * torch.log10(ref.norm() / noise)).item()
