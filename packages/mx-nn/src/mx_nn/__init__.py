"""mx-nn: ``MXLinear``, configs and recipes, and model conversion.

``convert(model, "mxfp8")`` swaps ``nn.Linear`` layers for :class:`MXLinear`, whose
three GEMMs run in MX (the GEMM table is in :mod:`mx_nn.config`). ``parallelize`` and
the ``mx-train`` command are not here yet.
"""

from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.convert import convert
from mx_nn.linear import MXLinear

__version__ = "0.1.0"

__all__ = ["MXLinear", "MXLinearConfig", "MXRecipe", "convert"]
