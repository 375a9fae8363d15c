"""mx-dtensor: DTensor sharding strategies for the ``mx`` ops and tensor-parallel styles
that communicate in MX. (Not written yet: this release only installs.)
"""

__version__ = "0.1.0"

__all__: list[str] = []
