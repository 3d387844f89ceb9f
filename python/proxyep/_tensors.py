"""torch tensors to native views and back, without copies (python/src/tensor_bridge.hpp).

``view(t, name)`` describes a CPU tensor's memory as ``(data_ptr, dtype name, shape, strides)``;
the caller keeps ``t`` alive for the call. ``tensor(capsule)`` wraps memory the runtime filled
(a DLPack capsule) as a torch tensor that keeps it alive.
"""

import torch
import torch.utils.dlpack

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


def view(t, name, fp8=False):
    """The native view of tensor ``t`` (None stays None).

    ``fp8``: a ``torch.uint8`` tensor holds e4m3 bytes. Tensors of more than two dimensions are
    viewed as 2-D (leading dimensions flattened), which needs them to be viewable that way.
    """
    if t is None:
        return None
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
    if fp8 and t.dtype == torch.uint8:
        name_of = "fp8_e4m3"
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension")
    if t.dim() > 2:
        try:
            t = t.view(-1, t.shape[-1])
        except RuntimeError as e:
            raise ValueError(f"{name} of shape {tuple(t.shape)} cannot be viewed as 2-D: {e}") from None
    ptr = t.data_ptr() if t.numel() > 0 else _EMPTY.data_ptr()
    return (ptr, name_of, tuple(t.shape), tuple(t.stride()))


def tensor(capsule, dtype=None):
    """A torch tensor over runtime memory (None stays None); ``dtype`` re-views bool or FP8."""
    if capsule is None:
        return None
    t = torch.utils.dlpack.from_dlpack(capsule)
    if dtype is torch.bool:
        return t.view(torch.bool)
    if dtype is not None and FP8_DTYPE is not None and dtype == FP8_DTYPE:
        return t.view(FP8_DTYPE)
    return t
