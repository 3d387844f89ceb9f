"""proxyep.moe: an expert-parallel MoE layer whose token exchange runs through ``deep_ep``
(docs/MOE.md). ``MoELayer`` (layer.py), the autograd exchange ``DispatchFunction`` /
``CombineFunction`` (exchange.py) and its DeepEP V2 twin ``ElasticExchange``
(elastic_exchange.py), and the dense single-process reference ``DenseMoE``
(reference.py); the tiny MoE language model ``TinyMoELM`` (model.py), its dense reference
``DenseTinyMoELM`` (reference_model.py) and the training helpers (training.py)."""

from .elastic_exchange import ElasticCombineFunction, ElasticDispatchFunction, ElasticExchange
from .exchange import CombineFunction, DispatchFunction
from .layer import MoELayer
from .model import KVCache, TinyMoELM, greedy_generate
from .reference import DenseMoE
from .reference_model import DenseTinyMoELM

__all__ = ["CombineFunction", "DenseMoE", "DenseTinyMoELM", "DispatchFunction", "ElasticCombineFunction",
           "ElasticDispatchFunction", "ElasticExchange", "KVCache", "MoELayer", "TinyMoELM", "greedy_generate"]
