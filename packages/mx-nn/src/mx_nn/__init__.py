"""mx-nn: ``MXLinear``, configs and recipes, and model conversion.

``convert(model, "mxfp8")`` swaps ``nn.Linear`` layers for :class:`MXLinear`, whose
three GEMMs run in MX (the GEMM table is in :mod:`mx_nn.config`). :class:`Llama` is a
compact decoder that :mod:`mx_nn.train` (the ``mx-train`` command) trains.
``parallelize`` comes with the parallelism issues.
"""

from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.convert import convert
from mx_nn.linear import MXLinear
from mx_nn.llama import Attention, FeedForward, Llama, LlamaConfig, TransformerBlock

__version__ = "0.1.0"

__all__ = ["MXLinear", "MXLinearConfig", "MXRecipe", "convert"]
__all__ += ["Attention", "FeedForward", "Llama", "LlamaConfig", "TransformerBlock"]
