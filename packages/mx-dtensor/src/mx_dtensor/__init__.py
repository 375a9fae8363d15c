"""mx-dtensor: DTensor sharding rules for every ``mx::`` op of mx-kernels.

``import mx_dtensor`` registers them (``mx_nn`` imports it, so users of MXLinear never
have to): the ops then run on DTensors as on plain tensors, each on its local shard,
with no communication and no silent redistribution. The rule table is in
:mod:`mx_dtensor.sharding`; a placement without a rule raises :class:`MXShardingError`.

Tensor-parallel styles for MX linears, drop-in for PyTorch's in ``parallelize_module``
(:mod:`mx_dtensor.styles`): they check whole MX blocks per rank and gather sequence
shards as MX casts (:func:`mx_all_gather`).
"""

import mx_dtensor.fused_rules  # noqa: F401  (the fused producers' rules)
from mx_dtensor.sharding import MX_OPS, MXShardingError, local_sizes, split_block_reason

__version__ = "0.1.0"

__all__ = ["MX_OPS", "MXShardingError", "local_sizes", "split_block_reason"]

from mx_dtensor.gather import GatheredCast, mx_all_gather, register_gather_hook  # noqa: E402
from mx_dtensor.styles import (  # noqa: E402
    MXColwiseParallel,
    MXRowwiseParallel,
    MXSequenceParallel,
    PrepareMXModuleInput,
)

__all__ += [
    "GatheredCast",
    "MXColwiseParallel",
    "MXRowwiseParallel",
    "MXSequenceParallel",
    "PrepareMXModuleInput",
    "mx_all_gather",
    "register_gather_hook",
]
