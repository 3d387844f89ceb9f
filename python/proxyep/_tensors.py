"""torch tensors to native views and back, without copies (python/src/tensor_bridge.hpp).

``view(t, name)`` describes a CPU or CUDA tensor's memory as ``(data_ptr, dtype name, shape,
strides, on_device)``; the caller keeps ``t`` alive for the call. ``tensor(capsule)`` wraps memory
the runtime filled (a DLPack capsule: a CUDA tensor for CUDA memory) as a torch tensor that keeps
it alive. ``to_device`` / ``to_host`` copy whole tensors to and from a ``_proxyep.Device`` (the
simulated device's memory is host memory torch sees as CPU tensors: these are how tests put
inputs there and read outputs back).
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


def view(t, name, fp8=False, on_device=False):
    """The native view of tensor ``t`` (None stays None).

    ``fp8``: a ``torch.uint8`` tensor holds e4m3 bytes. Tensors of more than two dimensions are
    viewed as 2-D (leading dimensions flattened), which needs them to be viewable that way. A
    CUDA tensor is device memory; ``on_device``: so is this CPU tensor (the simulated device's
    memory, which torch sees as host memory).
    """
    if t is None:
        return None
    # Every call passes up to nine tensors through here: the common case (a CPU or CUDA tensor of
    # one or two dimensions) takes the fewest attribute lookups; anything else gets the full
    # checks.
    try:
        name_of = _NAMES[t.dtype]
        cuda = t.is_cuda
        ok = (cuda or t.is_cpu) and 0 < t.dim() <= 2
    except (AttributeError, KeyError, TypeError):
        ok = False
    if not ok:
        t, name_of = _checked(t, name)
        cuda = t.is_cuda
    if fp8 and name_of == "u8":
        name_of = "fp8_e4m3"
    return (t.data_ptr() or _EMPTY_PTR, name_of, t.shape, t.stride(), on_device or cuda)


def _checked(t, name):
    """``t`` as a 1-D or 2-D CPU or CUDA tensor of a supported dtype, and its dtype's name; else
    the error that says what is wrong."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {t.device}: ProxyEP moves CPU and CUDA tensors")
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


def to_device(device, t):
    """A copy of CPU tensor ``t`` (contiguous) in ``device``'s memory (a ``_proxyep.Device``),
    with ``t``'s shape and dtype: a CUDA tensor on a GPU, a CPU tensor over the simulated device's
    memory."""
    copy = tensor(device.to_device(view(t.contiguous(), "tensor")), t.dtype)
    return copy.view(t.shape)


def to_host(device, t):
    """A CPU copy of tensor ``t``, which lives in ``device``'s memory (a CUDA tensor, or a tensor
    over the simulated device's memory, which only the device may touch), strides kept."""
    if t.is_contiguous():
        return tensor(device.to_host(view(t, "tensor", on_device=True)), t.dtype).view(t.shape)
    # The span the strides cover, as one row (a view: nothing is read here), copied whole.
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)
    if any(s < 0 for s in t.stride()):
        raise ValueError("to_host: negative strides")
    flat = tensor(device.to_host(view(t.as_strided((span,), (1,)), "tensor", on_device=True)), t.dtype)
    return flat.as_strided(t.shape, t.stride())
