"""torch tensors to native views and back, without copies (python/src/tensor_bridge.hpp).

``view(t, name)`` describes a CPU tensor's memory as ``(data_ptr, dtype name, shape, strides)``;
the caller keeps ``t`` alive for the call. ``tensor(capsule)`` wraps memory the runtime filled
(a DLPack capsule) as a torch tensor that keeps it alive.
"""

import torch
import torch.utils.dlpack

# torch.utils.dlpack.from_dlpack less its checks for other protocols (ours are always capsules).
_from_dlpack = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)

#: torch's e4m3 dtype when this torch has one (2.1+); None on torch 1.13, where FP8 data is a
#: ``torch.uint8`` tensor of e4m3 bytes.
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)

_NAMES = {
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "bool",
    torch.uint8: "u8",
}
if FP8_DTYPE is not None:
    _NAMES[FP8_DTYPE] = "fp8_e4m3"

# Stands in for the data pointer of empty tensors (torch may give them none): a null pointer
# with no rows means "None" to the runtime.
_EMPTY = torch.empty(64, dtype=torch.uint8)
_EMPTY_PTR = _EMPTY.data_ptr()


def view(t, name, fp8=False):
    """The native view of tensor ``t`` (None stays None).

    ``fp8``: a ``torch.uint8`` tensor holds e4m3 bytes. Tensors of more than two dimensions are
    viewed as 2-D (leading dimensions flattened), which needs them to be viewable that way.
    """
    if t is None:
        return None
    # Every call passes up to nine tensors through here: the common case (a CPU tensor of one or
    # two dimensions) takes the fewest attribute lookups; anything else gets the full checks.
    try:
        name_of = _NAMES[t.dtype]
        ok = t.is_cpu and 0 < t.dim() <= 2
    except (AttributeError, KeyError, TypeError):
        ok = False
    if not ok:
        t, name_of = _checked(t, name)
    if fp8 and name_of == "u8":
        name_of = "fp8_e4m3"
    return (t.data_ptr() or _EMPTY_PTR, name_of, t.shape, t.stride())


def _checked(t, name):
    """``t`` as a 1-D or 2-D CPU tensor of a supported dtype, and its dtype's name; else the
    error that says what is wrong."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} is on {t.device}: this build of ProxyEP moves CPU tensors only "
            "(the CUDA backend is not built yet)"
        )
    name_of = _NAMES.get(t.dtype)
    if name_of is None:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported")
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension")
    try:
        return t.view(-1, t.shape[-1]), name_of
    except RuntimeError as e:
        raise ValueError(f"{name} of shape {tuple(t.shape)} cannot be viewed as 2-D: {e}") from None


def tensor(capsule, dtype=None):
    """A torch tensor over runtime memory (None stays None); ``dtype`` re-views bool or FP8."""
    if capsule is None:
        return None
    t = _from_dlpack(capsule)
    if dtype is torch.bool:
        return t.view(torch.bool)
    if dtype is not None and FP8_DTYPE is not None and dtype == FP8_DTYPE:
        return t.view(FP8_DTYPE)
    return t
