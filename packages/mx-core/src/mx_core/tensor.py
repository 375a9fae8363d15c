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
from mx_core.formats import ElementFormat, get_format
from mx_core.packing import unpack_fp4
from mx_core.scale import e8m0_to_float

__all__ = ["MXTensor"]


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
        ``orig_dtype``). NaN-scale blocks decode to NaN."""
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
        for name, value in (("dim0", dim0), ("dim1", dim1)):
            if not -n <= value < n:
                raise ValueError(f"transpose: {name}={value} is out of range for {n} dims")
        d0, d1 = dim0 % n, dim1 % n
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
        n = self.ndim
        if not -n <= dim < n:
            raise ValueError(f"narrow: dim={dim} is out of range for {n} dims")
        d = dim % n
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
            if not isinstance(k, (int, slice)):
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
