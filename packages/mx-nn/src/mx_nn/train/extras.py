"""The ``mx-nn[train]`` extras, imported on first use with an error that says how to
install them."""

from __future__ import annotations

from typing import Any

__all__: list[str] = []  # pyplot and tqdm come through __getattr__

_HINT = "mx-train needs {name}: pip install 'mx-nn[train]'"


def __getattr__(name: str) -> Any:
    if name == "tqdm":
        try:
            from tqdm import tqdm
        except ImportError as e:
            raise ImportError(_HINT.format(name="tqdm")) from e
        return tqdm
    if name == "pyplot":
        try:
            import matplotlib
        except ImportError as e:
            raise ImportError(_HINT.format(name="matplotlib")) from e
        matplotlib.use("Agg")  # files only; never a display
        from matplotlib import pyplot

        return pyplot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
