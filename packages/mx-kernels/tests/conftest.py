import os

# Triton's interpreter runs the kernels on CPU tensors; it must be on before triton is
# imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")


import functools  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def fresh_backend_choices(monkeypatch):
    """Backend choices are cached per process: a test that patches what they depend on
    gets its own cache, made under its patches and dropped after it."""
    from mx_kernels import backend

    monkeypatch.setattr(backend, "_choice", functools.lru_cache(backend._choice.__wrapped__))
