import os

# Triton's interpreter runs the kernels on CPU tensors; it must be on before triton is
# imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")

import functools  # noqa: E402

import pytest  # noqa: E402

# Imported now, under the interpreter: triton.language's own jit helpers take their
# mode when triton is first imported, and tests that set TRITON_INTERPRET=0 (to check
# the error) would otherwise leave them compiled-mode for every later interpreted
# kernel in the process ("Cannot call @triton.jit'd outside of the scope of a kernel").
import triton  # noqa: E402, F401


@pytest.fixture
def fresh_backend_choices(monkeypatch):
    """Backend choices (and the cast plans holding them) are cached per process: a test
    that patches what they depend on gets its own caches, made under its patches and
    dropped after it."""
    from mx_kernels import backend, cast_plan

    monkeypatch.setattr(backend, "_choice", functools.lru_cache(backend._choice.__wrapped__))
    monkeypatch.setattr(cast_plan, "_PLANS", {})
