"""Safetensors files, written one tensor at a time and read one tensor at a time.

The format (huggingface/safetensors, "Format" in its README): 8 bytes, a little-endian
u64 N; N bytes of UTF-8 JSON mapping each tensor name to ``{"dtype", "shape",
"data_offsets": [begin, end]}`` (offsets into the data after the header; the tensors
fill it without holes or overlaps) plus an optional ``"__metadata__"`` of strings;
then the data, each tensor row-major little-endian. The header is padded with spaces
to a multiple of 8 bytes so every tensor starts aligned.

Written here rather than through the ``safetensors`` package so that a shard can be
streamed: its header is known from the shapes alone, and each tensor is written as
it is made (an export never holds the whole model). Little-endian hosts only (the
bytes are the tensors' own).
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

__all__ = ["DTYPE_NAMES", "ShardWriter", "TensorSpec", "iter_tensors", "read_header", "read_tensor"]

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}  # fmt: skip
"""torch dtype -> the safetensors dtype string (the dtypes an export writes or reads)."""
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_ALIGN = 8


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """Name, dtype and shape of one tensor of a shard (known before it is made)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(
                f"TensorSpec {self.name!r}: dtype {self.dtype} has no safetensors name; "
                f"allowed: {', '.join(map(str, DTYPE_NAMES))}"
            )

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def _check_host() -> None:
    if sys.byteorder != "little":
        raise RuntimeError("safetensors files are little-endian; this host is big-endian")


def _header(specs: list[TensorSpec], metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for s in specs:
        entries[s.name] = {"dtype": DTYPE_NAMES[s.dtype], "shape": list(s.shape),
                           "data_offsets": [offset, offset + s.nbytes]}  # fmt: skip
        offset += s.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw


class ShardWriter:
    """Writes one safetensors file whose tensors are declared up front (``specs``, in
    file order) and then handed over one at a time with :meth:`write`, in that order.

    Raises (from :meth:`write`): ValueError for a tensor other than the next declared
    one (name, dtype or shape); :meth:`close` raises ValueError if any is missing.
    """

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str]) -> None:
        _check_host()
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"ShardWriter {path}: duplicate tensor names")
        self.path, self._specs, self._next = Path(path), list(specs), 0
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._file.write(_header(self._specs, metadata))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append ``tensor`` (any device; copied to CPU, contiguous) as ``name``."""
        if self._next >= len(self._specs):
            raise ValueError(f"{self.path}: {name!r} written after every declared tensor")
        spec = self._specs[self._next]
        got = (name, tensor.dtype, tuple(tensor.shape))
        if got != (spec.name, spec.dtype, spec.shape):
            raise ValueError(
                f"{self.path}: expected {spec.name!r} {spec.dtype} {list(spec.shape)} next, "
                f"got {name!r} {tensor.dtype} {list(tensor.shape)}"
            )
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        if data.numel():  # the tensor's own bytes, without a copy (data stays alive here)
            self._file.write((ctypes.c_ubyte * data.numel()).from_address(data.data_ptr()))
        self._next += 1

    def close(self) -> None:
        """Flush and close the file; every declared tensor must have been written."""
        self._file.close()
        if self._next != len(self._specs):
            left = [s.name for s in self._specs[self._next :]]
            raise ValueError(f"{self.path}: {len(left)} tensor(s) never written: {left[:4]}")

    def abort(self) -> None:
        """Close the file without checking (the caller removes it)."""
        self._file.close()


def read_header(path: Path) -> tuple[dict[str, dict], int]:
    """The header of a safetensors file.

    Args:
        path: the file.
    Returns:
        ``(entries, start)``: name -> ``{"dtype", "shape", "data_offsets"}`` of every
        tensor (no ``__metadata__``), and the byte offset where the data starts.
    Raises:
        RuntimeError: a big-endian host.
        ValueError: a file too short or with a header that is not safetensors JSON.
    """
    _check_host()
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        raw = f.read(n)
    try:
        entries = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(entries, dict) or len(raw) != n:
        raise ValueError(f"{path}: not a safetensors file (truncated header)")
    entries.pop("__metadata__", None)
    return entries, 8 + n


def read_tensor(path: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file, read alone.

    Args:
        path: the file.
        name: the tensor's name there.
    Returns:
        A CPU tensor of the stored dtype and shape (its own memory).
    Raises:
        KeyError: no tensor of that name in the file.
        ValueError: a dtype this reader does not know, or a short file.
    """
    entries, start = read_header(path)
    return _read(path, name, entries, start)


def _read(path: Path, name: str, entries: dict[str, dict], start: int) -> torch.Tensor:
    if name not in entries:
        raise KeyError(f"{path} holds no tensor {name!r}")
    entry = entries[name]
    if entry["dtype"] not in _DTYPES:
        raise ValueError(f"{path}: {name!r} has dtype {entry['dtype']}, which is not read here")
    begin, end = entry["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + begin)
        data = f.read(end - begin)
    if len(data) != end - begin:
        raise ValueError(f"{path}: {name!r} is cut short ({len(data)} of {end - begin} bytes)")
    if not data:
        raw = torch.empty(0, dtype=torch.uint8)
    else:
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def iter_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a safetensors file, read one at a time, in file order.

    Args:
        path: the file.
    """
    entries, start = read_header(path)
    order = sorted(entries, key=lambda n: entries[n]["data_offsets"][0])
    for name in order:
        yield name, _read(path, name, entries, start)
