"""Where MXLinear gets the MX casts of X, W and dY.

- :mod:`~mx_nn.casts.compute_path`: which path runs (MX GEMMs or fake-quantized bf16
  GEMMs) and the cast arguments of a config;
- :mod:`~mx_nn.casts.layer`: the casts of the MX path (rowwise, columnwise, both);
- :mod:`~mx_nn.casts.fused`: the casts of the fused (fake-quantized) path;
- :mod:`~mx_nn.casts.scopes`: casts shared by layers reading one input within a call,
  and weight casts kept across micro-batches;
- :mod:`~mx_nn.casts.gathered`: casts handed over by an MX all-gather.
"""

from mx_nn.casts.gathered import enable_gather_handover
from mx_nn.casts.scopes import add_cast_scope, keep_weight_casts, shared_casts

__all__ = ["add_cast_scope", "enable_gather_handover", "keep_weight_casts", "shared_casts"]
