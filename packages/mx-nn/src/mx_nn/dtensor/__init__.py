"""How MXLinear runs on DTensor inputs and weights.

- :mod:`~mx_nn.dtensor.placements`: the layout of one call (which dims are sharded,
  what the output's placements are), checked before any op runs;
- :mod:`~mx_nn.dtensor.local_shards`: the whole MX linear as one op on the local shards.
"""
