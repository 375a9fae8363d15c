import builtins
import io
import os
import shutil

import pytest

# A model small enough that a run of a few steps takes about a second on one CPU core.
TINY = ["--layers", "1", "--dim", "64", "--heads", "2", "--kv-heads", "1", "--seq", "32",
        "--batch", "4", "--device", "cpu"]  # fmt: skip


@pytest.fixture
def tiny() -> list[str]:
    return list(TINY)


class Crash(BaseException):
    """A crash at a file operation. A BaseException, so no ``except Exception`` of
    mx-train handles it, as no handler runs after a real crash (kill -9, power loss)."""


OS_OPS = ("mkdir", "rename", "replace", "unlink", "rmdir", "fsync")
"""The ``os`` functions counted (``pathlib`` and ``shutil.rmtree`` call them too)."""


class _Written:
    """A file opened for writing whose first ``write`` is a counted operation (a crash
    at any later write of the file leaves the same: part of it, then nothing)."""

    def __init__(self, f, hit) -> None:
        self._f, self._hit, self._started = f, hit, False

    def write(self, data):
        if not self._started:
            self._started = True
            self._hit("write", self._f.name)
        return self._f.write(data)

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._f, name)


class Faults:
    """Wraps the real file operations (``open`` and the first ``write`` of a file opened
    to write, ``os.mkdir/rename/replace/unlink/rmdir/fsync``, ``shutil.rmtree``); while
    armed, counts the calls (of one kind, with ``op``) and raises ``error`` (default a
    :class:`Crash`) just before performing the ``at``-th."""

    Crash = Crash

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed, self.at, self.op, self.error = False, None, None, None
        self.log: list[tuple[str, str]] = []
        real_open = builtins.open

        def opened(file, mode="r", *args, **kwargs):
            self._hit("open", str(file))
            f = real_open(file, mode, *args, **kwargs)
            return _Written(f, self._hit) if self.armed and set(mode) & set("wax+") else f

        monkeypatch.setattr(builtins, "open", opened)
        monkeypatch.setattr(io, "open", opened)  # pathlib's Path.open calls io.open
        for name in OS_OPS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))
        monkeypatch.setattr(shutil, "rmtree", self._wrap("rmtree", shutil.rmtree))

    def _wrap(self, name, fn):
        def wrapped(*args, **kwargs):
            self._hit(name, str(args[0]) if args else "")
            return fn(*args, **kwargs)

        return wrapped

    def _hit(self, name: str, what: str) -> None:
        if not self.armed or (self.op is not None and name != self.op):
            return
        self.log.append((name, what))
        if len(self.log) == self.at:
            self.armed = False
            raise self.error if self.error is not None else Crash(f"{name} #{self.at}: {what}")

    def arm(self, at: int | None = None, *, op: str | None = None,
            error: BaseException | None = None) -> None:  # fmt: skip
        """Count from now; fail at the ``at``-th call (None: only count)."""
        self.armed, self.at, self.op, self.error, self.log = True, at, op, error, []

    def disarm(self) -> list[tuple[str, str]]:
        """Stop counting; the calls counted."""
        self.armed = False
        return self.log


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    return Faults(monkeypatch)
