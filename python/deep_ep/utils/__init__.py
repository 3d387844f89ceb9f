"""DeepEP's ``deep_ep.utils`` package. DeepEP 2.1 exports only ``EventHandle`` here; ProxyEP keeps
``EventOverlap`` (Megatron-LM and older DeepEP code import it from here) and ``cuda_available``."""

from .event import EventHandle, EventOverlap, cuda_available  # noqa: F401

__all__ = ["EventHandle", "EventOverlap", "cuda_available"]
