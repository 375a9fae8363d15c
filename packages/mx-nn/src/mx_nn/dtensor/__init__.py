"""How MXLinear runs on DTensor inputs and weights.

- :mod:`~mx_nn.dtensor.placements`: the layout of one call (which dims are sharded,
  what the output's placements are), checked before any op runs;
- :mod:`~mx_nn.dtensor.local_shards`: the whole MX linear as one op on the local shards,
  and :func:`~mx_nn.dtensor.local_shards.dispatch_per_op`, which dispatches each mx op
  through DTensor instead (the reference it is compared against).
"""

from mx_nn.dtensor.local_shards import dispatch_per_op, local_shards_enabled
from mx_nn.dtensor.placements import LinearLayout, check_placements, linear_layout

__all__ = [
    "LinearLayout",
    "check_placements",
    "dispatch_per_op",
    "linear_layout",
    "local_shards_enabled",
]
