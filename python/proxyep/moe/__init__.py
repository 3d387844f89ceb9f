"""proxyep.moe: an expert-parallel MoE layer whose token exchange runs through ``deep_ep``
(docs/MOE.md). ``MoELayer`` (layer.py), the autograd exchange ``DispatchFunction`` /
``CombineFunction`` (exchange.py), and the dense single-process reference ``DenseMoE``
(reference.py)."""

from .exchange import CombineFunction, DispatchFunction
from .layer import MoELayer
from .reference import DenseMoE

__all__ = ["CombineFunction", "DenseMoE", "DispatchFunction", "MoELayer"]
