"""``MXTensor``: element codes plus one E8M0 scale per block along one dim.

A plain container, not a tensor subclass: the hot path of the other packages works on
``(qdata, scale)`` pairs through ops. Layout, for a tensor ``x`` of shape ``S`` blocked
along dim ``d`` with block size ``bs``:

- ``qdata``: shape ``S`` (fp8, fp6 codes), or ``S`` with ``S[d]`` halved (fp4, two codes
  per byte along ``d``, first element in the low nibble).
- ``scale``: shape ``S`` with ``S[d]`` divided by ``bs``, dtype ``torch.float8_e8m0fnu``;
  ``scale[..., j, ...]`` scales elements ``j*bs .. (j+1)*bs - 1`` along ``d``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from mx_core import elements
from mx_core.args import check_dim, check_int
from mx_core.formats import ElementFormat, get_format
from mx_core.packing import unpack_fp4
from mx_core.scale import e8m0_to_float

__all__ = ["DEQUANTIZE_DTYPES", "MXTensor"]

DEQUANTIZE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
)
"""Dtypes :meth:`MXTensor.dequantize` decodes to (and ``orig_dtype`` may be)."""


@dataclass(frozen=True, eq=False)
class MXTensor:
    """An MX-quantized tensor (see the module doc for the layout)."""

    qdata: torch.Tensor
    """Element codes (layout in the module doc)."""
    scale: torch.Tensor
    """E8M0 block scales, ``torch.float8_e8m0fnu``."""
    fmt: str
    """Element format name, e.g. ``"fp8_e4m3"``."""
    block_size: int
    """Elements per scale along ``dim``."""
    dim: int
    """The blocked dim, non-negative."""
    orig_dtype: torch.dtype
    """dtype of the tensor that was quantized; the default of :meth:`dequantize`."""

    def __post_init__(self) -> None:
        """Refuse parts that do not make one MX tensor (layout in the module doc).

        Raises:
            TypeError: qdata or scale not a tensor; a dtype that does not fit; fmt not a
                str; block_size or dim not an int.
            ValueError: unknown fmt; block_size not a positive multiple of 2; dim out of
                range; qdata's and scale's ranks, shapes or devices that do not match.
        """
        fn = "MXTensor"
        for name in ("qdata", "scale"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not isinstance(self.fmt, str):
            raise TypeError(f"{fn}: fmt must be a format name (str), got {self.fmt!r}")
        try:
            f = get_format(self.fmt)
        except ValueError as e:
            raise ValueError(f"{fn}: {e}") from None
        qdata, scale = self.qdata, self.scale
        if scale.dtype != torch.float8_e8m0fnu:
            raise TypeError(f"{fn}: scale has dtype {scale.dtype}; expected torch.float8_e8m0fnu")
        if qdata.dtype != f.storage_dtype:
            hint = " (view packed fp4 as torch.uint8)" if f.is_packed else ""
            raise TypeError(
                f"{fn}: qdata has dtype {qdata.dtype}; {f.name} codes are stored as "
                f"{f.storage_dtype}{hint}"
            )
        if self.orig_dtype not in DEQUANTIZE_DTYPES:
            allowed = ", ".join(str(d) for d in DEQUANTIZE_DTYPES)
            raise TypeError(f"{fn}: orig_dtype={self.orig_dtype!r}; allowed: {allowed}")
        bs = check_int(fn, "block_size", self.block_size, minimum=1)
        if bs % 2:
            raise ValueError(f"{fn}: block_size={bs} must be a positive multiple of 2")
        if qdata.dim() != scale.dim() or qdata.dim() == 0:
            raise ValueError(
                f"{fn}: qdata (shape {tuple(qdata.shape)}) and scale (shape "
                f"{tuple(scale.shape)}) must have the same number of dims, at least 1"
            )
        if check_dim(fn, "dim", self.dim, qdata.dim()) != self.dim:
            raise ValueError(f"{fn}: dim={self.dim} must be non-negative (the blocked dim)")
        if qdata.device != scale.device:
            raise ValueError(f"{fn}: qdata is on {qdata.device} but scale on {scale.device}")
        # Under torch.compile a branch on a dynamic size leaves a SymInt among an
        # autograd.Function's outputs, which dynamo asserts on (as in check_quantize_args);
        # the decoding ops check these sizes themselves there.
        if torch.compiler.is_compiling():
            return
        want = list(scale.shape)
        want[self.dim] = want[self.dim] * bs // (2 if f.is_packed else 1)
        if list(qdata.shape) != want:
            packed = ", two fp4 codes per byte" if f.is_packed else ""
            raise ValueError(
                f"{fn}: qdata has shape {tuple(qdata.shape)} but scale {tuple(scale.shape)} "
                f"with block_size={bs} along dim {self.dim} needs qdata {tuple(want)}{packed}"
            )

    @property
    def format(self) -> ElementFormat:
        """The :class:`ElementFormat` of ``fmt``."""
        return get_format(self.fmt)

    @property
    def shape(self) -> torch.Size:
        """Logical (unpacked) shape, the shape of the tensor that was quantized."""
        shape = list(self.scale.shape)
        shape[self.dim] *= self.block_size
        return torch.Size(shape)

    @property
    def device(self) -> torch.device:
        """Device of qdata and scale."""
        return self.qdata.device

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return self.scale.dim()

    def codes(self) -> torch.Tensor:
        """Element codes with fp4 unpacked: float8 for fp8, else uint8; logical shape."""
        if self.format.is_packed:
            return unpack_fp4(self.qdata, self.dim)
        return self.qdata

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Decoded values ``q * 2^e`` computed in fp32, cast to ``dtype`` (default
        ``orig_dtype``; one of :data:`DEQUANTIZE_DTYPES`). NaN-scale blocks decode to NaN.

        Raises:
            TypeError: dtype is not a torch.dtype.
            ValueError: dtype is not one of :data:`DEQUANTIZE_DTYPES` (an integer or fp8
                dtype would truncate or wrap the values).
        """
        if dtype is not None and dtype not in DEQUANTIZE_DTYPES:
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"dequantize: dtype must be a torch.dtype, got {dtype!r}")
            allowed = ", ".join(str(d) for d in DEQUANTIZE_DTYPES)
            raise ValueError(f"dequantize: dtype={dtype} is not supported; allowed: {allowed}")
        values = elements.decode(self.codes(), self.format)
        d, nblocks = self.dim, self.scale.shape[self.dim]
        blocks = values.unflatten(d, (nblocks, self.block_size))
        out = blocks * e8m0_to_float(self.scale).unsqueeze(d + 1)
        return out.flatten(d, d + 1).to(dtype or self.orig_dtype)

    def to(self, device: torch.device | str) -> MXTensor:
        """Copy to ``device`` (bit-exact)."""
        return replace(self, qdata=self.qdata.to(device), scale=self.scale.to(device))

    def transpose(self, dim0: int, dim1: int) -> MXTensor:
        """Swap two dims (exact: the blocked dim is tracked, nothing is requantized)."""
        n = self.ndim
        d0, d1 = check_dim("transpose", "dim0", dim0, n), check_dim("transpose", "dim1", dim1, n)
        new_dim = {d0: d1, d1: d0}.get(self.dim, self.dim)
        return replace(
            self,
            qdata=self.qdata.transpose(d0, d1),
            scale=self.scale.transpose(d0, d1),
            dim=new_dim,
        )

    def narrow(self, dim: int, start: int, length: int) -> MXTensor:
        """Slice along ``dim`` (exact); along the blocked dim, start and length must be
        multiples of ``block_size``."""
        d = check_dim("narrow", "dim", dim, self.ndim)
        check_int("narrow", "start", start)
        check_int("narrow", "length", length, minimum=0)
        if d != self.dim:
            return replace(
                self,
                qdata=self.qdata.narrow(d, start, length),
                scale=self.scale.narrow(d, start, length),
            )
        bs = self.block_size
        if start % bs or length % bs:
            raise ValueError(
                f"narrow: start={start} and length={length} along the blocked dim {d} "
                f"must be multiples of block_size={bs}"
            )
        pack = 2 if self.format.is_packed else 1
        return replace(
            self,
            qdata=self.qdata.narrow(d, start // pack, length // pack),
            scale=self.scale.narrow(d, start // bs, length // bs),
        )

    def __getitem__(self, key: Any) -> MXTensor:
        """Basic indexing (ints, slices, ``...``) that leaves the blocked dim whole."""
        if not isinstance(key, tuple):
            key = (key,)
        n = self.ndim
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (n - len(key) + 1) + key[i + 1 :]
        for k in key:
            # bool is an int to Python but a mask to torch (it adds a dim)
            if isinstance(k, bool) or not isinstance(k, (int, slice)):
                raise TypeError(f"MXTensor indexing takes ints, slices and ..., got {k!r}")
        key = key + (slice(None),) * (n - len(key))
        if len(key) > n:
            raise IndexError(f"too many indices for an MXTensor of {n} dims")
        if key[self.dim] != slice(None):
            raise IndexError(
                f"index {key[self.dim]!r} touches the blocked dim {self.dim}; use "
                "narrow() with block-aligned bounds to slice it"
            )
        new_dim = self.dim - sum(isinstance(k, int) for k in key[: self.dim])
        return replace(self, qdata=self.qdata[key], scale=self.scale[key], dim=new_dim)

    def __repr__(self) -> str:
        return (
            f"MXTensor(shape={tuple(self.shape)}, fmt={self.fmt!r}, "
            f"block_size={self.block_size}, dim={self.dim}, orig_dtype={self.orig_dtype}, "
            f"device={self.device})"
        )
