"""A Hugging Face model directory, written tensor by tensor: ``config.json``, safetensors
shards ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``, and
the generation config and tokenizer files when there are any.

Everything is written into a hidden folder beside ``out_dir`` that is renamed to it
once complete, so ``out_dir`` never holds half an export; a failure removes the folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from mx_nn.export.safetensors_io import ShardWriter, TensorSpec

__all__ = ["DEFAULT_SHARD_BYTES", "INDEX", "TOKENIZER_FILES", "DirWriter", "check_out_dir",
           "copy_tokenizer_files", "saved_by", "shard_specs"]  # fmt: skip

DEFAULT_SHARD_BYTES = 5 * 2**30
"""Largest shard (bytes) unless asked otherwise (a tensor larger than it gets its own)."""
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")  # fmt: skip
"""Files a Hugging Face tokenizer may be saved as, copied from a model's own folder."""


def check_out_dir(out_dir: object) -> Path:
    """Check an export's folder: it must be new or empty (an export never writes over
    files).

    Args:
        out_dir: the folder, as given.
    Returns:
        ``out_dir`` as a Path.
    Raises:
        TypeError: not a str or os.PathLike.
        ValueError: it is a file, or a folder that holds anything.
    """
    if not isinstance(out_dir, str | os.PathLike):
        raise TypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out_dir {str(path)!r} is a file; give a new or empty folder")
    if path.is_dir() and any(path.iterdir()):
        raise ValueError(
            f"out_dir {str(path)!r} is not empty; give a new or empty folder (an export "
            f"never writes over files)"
        )
    return path


def shard_specs(groups: list[list[TensorSpec]], max_bytes: int) -> list[list[int]]:
    """Which groups go to each safetensors shard.

    Args:
        groups: each entry's tensors, in writing order.
        max_bytes: the largest shard, in bytes (a group larger gets a shard of its own).
    Returns:
        Per shard, the indices of its groups, in order: consecutive groups until the next
        would pass ``max_bytes``; a group is never split.
    """
    shards: list[list[int]] = [[]]
    size = 0
    for i, group in enumerate(groups):
        n = sum(s.nbytes for s in group)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += n
    return shards


class DirWriter:
    """Writes one export folder: :meth:`write` each group's tensors in order, then
    :meth:`finish`. ``groups``: the tensors of each entry, known up front (shapes
    decide the shards); an entry's tensors stay in one shard."""

    def __init__(self, out_dir: Path, groups: list[list[TensorSpec]], max_shard_bytes: int):
        self.out_dir = out_dir
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        self._groups = groups
        self._shards = shard_specs(groups, max_shard_bytes)
        n = len(self._shards)
        self._names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self._shard_of = {g: s for s, members in enumerate(self._shards) for g in members}
        self._open: ShardWriter | None = None
        self._open_index = -1
        self._next = 0

    def write(self, tensors: list[torch.Tensor]) -> None:
        """The tensors of the next group, in its declared order."""
        g = self._next
        shard = self._shard_of[g]
        if shard != self._open_index:
            if self._open is not None:
                self._open.close()
            specs = [s for i in self._shards[shard] for s in self._groups[i]]
            self._open = ShardWriter(self.tmp / self._names[shard], specs, {"format": "pt"})
            self._open_index = shard
        for spec, tensor in zip(self._groups[g], tensors, strict=True):
            self._open.write(spec.name, tensor)
        self._next += 1

    def finish(self, config: dict, extras: list[Callable[[Path], None]]) -> Path:
        """Close the last shard, write the index, ``config`` as config.json and each of
        ``extras`` (called with the folder), then move the folder to ``out_dir``."""
        if self._open is not None:
            self._open.close()
            self._open = None
        weight_map, total = {}, 0
        for shard, members in enumerate(self._shards):
            for i in members:
                for spec in self._groups[i]:
                    weight_map[spec.name] = self._names[shard]
                    total += spec.nbytes
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (self.tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for extra in extras:
            extra(self.tmp)
        if self.out_dir.is_dir():
            self.out_dir.rmdir()  # empty (checked before the export began)
        os.replace(self.tmp, self.out_dir)
        return self.out_dir

    def abort(self) -> None:
        """Remove what was written."""
        if self._open is not None:
            self._open.abort()
            self._open = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def copy_tokenizer_files(source: Path) -> Callable[[Path], None] | None:
    """An extra that copies the tokenizer files of a folder.

    Args:
        source: the folder to copy from.
    Returns:
        A function of the export folder that copies the :data:`TOKENIZER_FILES` found in
        ``source`` into it, or None when ``source`` holds none.
    """
    found = [source / n for n in TOKENIZER_FILES if (source / n).is_file()]
    if not found:
        return None

    def copy(folder: Path) -> None:
        for path in found:
            shutil.copy2(path, folder / path.name)

    return copy


def saved_by(obj: object, what: str) -> Callable[[Path], None]:
    """An extra that calls ``obj.save_pretrained(folder)``.

    Args:
        obj: a tokenizer or generation config.
        what: its argument's name, for the message.
    Returns:
        A function of the export folder that saves ``obj`` there.
    Raises:
        TypeError: ``obj`` has no ``save_pretrained``.
    """
    if not callable(getattr(obj, "save_pretrained", None)):
        raise TypeError(f"{what} must have save_pretrained(folder) (or be a folder), got "
                        f"{type(obj).__name__}")  # fmt: skip

    def save(folder: Path) -> None:
        obj.save_pretrained(str(folder))

    return save
