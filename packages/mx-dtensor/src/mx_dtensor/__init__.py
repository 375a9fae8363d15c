"""mx-dtensor: DTensor sharding rules for every ``mx::`` op of mx-kernels.

``import mx_dtensor`` registers them (``mx_nn`` imports it, so users of MXLinear never
have to): the ops then run on DTensors as on plain tensors, each on its local shard,
with no communication and no silent redistribution. The rule table is in
:mod:`mx_dtensor.sharding`; a placement without a rule raises :class:`MXShardingError`.
"""

from mx_dtensor.sharding import MX_OPS, MXShardingError, local_sizes, split_block_reason

__version__ = "0.1.0"

__all__ = ["MX_OPS", "MXShardingError", "local_sizes", "split_block_reason"]
