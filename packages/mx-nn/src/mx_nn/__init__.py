"""mx-nn: ``MXLinear``, configs and recipes, and model conversion.

``convert(model, "mxfp8")`` swaps ``nn.Linear`` layers for :class:`MXLinear`, whose
three GEMMs run in MX (the GEMM table is in :mod:`mx_nn.config`). :class:`Llama` is a
compact decoder that :mod:`mx_nn.train` (the ``mx-train`` command) trains.
``parallelize(model, mesh)`` converts a Llama-style model and applies tensor, sequence
and FSDP2 parallelism (:mod:`mx_nn.parallelize`, plan in :mod:`mx_nn.tp_plan`);
``enable_fsdp_mx_all_gather`` makes FSDP2 gather MXLinear weights in MX
(:mod:`mx_nn.fsdp_weight`).
"""

from mx_nn.cast_cache import keep_weight_casts, shared_casts
from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.convert import convert
from mx_nn.fsdp_weight import enable_fsdp_mx_all_gather
from mx_nn.linear import MXLinear, share_input_casts
from mx_nn.llama import Attention, FeedForward, Llama, LlamaConfig, TransformerBlock
from mx_nn.parallelize import parallelize

__version__ = "0.1.0"

__all__ = ["MXLinear", "MXLinearConfig", "MXRecipe", "convert"]
__all__ += ["Attention", "FeedForward", "Llama", "LlamaConfig", "TransformerBlock"]
__all__ += ["enable_fsdp_mx_all_gather", "parallelize"]
__all__ += ["keep_weight_casts", "share_input_casts", "shared_casts"]
