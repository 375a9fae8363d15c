"""mx-nn: ``MXLinear``, configs and recipes, model conversion, ``parallelize`` and the
``mx-train`` command. (Their issues come after the kernels; this release only installs.)
"""

__version__ = "0.1.0"

__all__: list[str] = []
