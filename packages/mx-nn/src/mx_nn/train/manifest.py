"""A checkpoint's manifest: the size and SHA-256 of every file, written last (so a
checkpoint folder without one is incomplete) and checked before a resume; and the
fsyncs that make a write durable before the next operation relies on it.

The manifest file is JSON followed by one line ``sha256 <hex>`` that digests every byte
above it, so a changed byte anywhere in the manifest is detected too.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["MANIFEST", "CheckpointError", "check_files", "digest", "fsync_dir", "read", "write"]

MANIFEST = "manifest"
"""The manifest's file name inside a checkpoint folder."""
FORMAT = 1
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint cannot be written, found or trusted; the message names the file."""


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (files created, renamed, removed) durable.

    Args:
        path: the folder, fsynced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def digest(path: Path, *, sync: bool = False) -> dict:
    """The size and SHA-256 of a file.

    Args:
        path: the file.
        sync: fsync it too (its data durable before a manifest vouches for it).
    Returns:
        ``{"bytes": size, "sha256": hex digest}``.
    """
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return {"bytes": size, "sha256": h.hexdigest()}


def _seal(payload: bytes) -> bytes:
    return payload + b"sha256 " + hashlib.sha256(payload).hexdigest().encode() + b"\n"


def write(folder: Path, files: dict[str, dict]) -> Path:
    """Write a folder's manifest in one rename, then fsync the folder: once this returns
    the checkpoint is complete.

    Args:
        folder: the generation folder.
        files: name -> :func:`digest` of every file it vouches for.
    Returns:
        The manifest's path.
    """
    body = {"format": FORMAT, "files": dict(sorted(files.items()))}
    data = _seal((json.dumps(body, indent=1) + "\n").encode())
    tmp, final = folder / (MANIFEST + ".tmp"), folder / MANIFEST
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(folder)
    return final


def read(folder: Path) -> dict[str, dict]:
    """The files a folder's manifest lists.

    Args:
        folder: the generation folder.
    Returns:
        name -> ``{"bytes", "sha256"}``.
    Raises:
        CheckpointError: the manifest is missing or unreadable, any byte of it was
            changed, or it is not of this format.
    """
    path = folder / MANIFEST
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    cut = raw.rfind(b"\n", 0, len(raw) - 1) + 1
    if not raw.endswith(b"\n") or cut == 0 or _seal(raw[:cut]) != raw:
        raise CheckpointError(f"{path} is corrupt: its bytes do not match its own sha256 line")
    try:
        body = json.loads(raw[:cut])
        files = body["files"]
        ok = body["format"] == FORMAT and all(
            Path(n).name == n and n not in ("", ".", "..") and isinstance(d["bytes"], int)
            and isinstance(d["sha256"], str) for n, d in files.items()
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path} is not an mx-train manifest of format {FORMAT}")
    return files


def check_files(folder: Path, files: dict[str, dict]) -> list[str]:
    """What is wrong with the files of a folder.

    Args:
        folder: the generation folder.
        files: name -> the expected :func:`digest`.
    Returns:
        One line per file that is missing or unreadable, of another size or of other
        bytes; empty when all match.
    """
    problems = []
    for name, want in files.items():
        path = folder / name
        try:
            got = digest(path)
        except OSError as e:
            problems.append(f"{path}: listed in the manifest but cannot be read "
                            f"({e.strerror or e})")  # fmt: skip
            continue
        if got["bytes"] != want["bytes"]:
            problems.append(f"{path}: {got['bytes']} bytes, the manifest says {want['bytes']}")
        elif got["sha256"] != want["sha256"]:
            problems.append(f"{path}: sha256 {got['sha256'][:16]}..., the manifest says "
                            f"{want['sha256'][:16]}... (the file's bytes changed)")  # fmt: skip
    return problems
