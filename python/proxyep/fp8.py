"""FP8 (e4m3) helpers for torch versions without float8 dtypes: the value of every e4m3 byte, and
DeepEP's per-128-channel dequantisation of low-latency dispatch outputs."""

import torch

from ._tensors import FP8_DTYPE

_VALUES = None


def e4m3_values():
    """float32 [256]: the value of each e4m3 byte (0 for the two NaN codes)."""
    global _VALUES
    if _VALUES is None:
        out = []
        for code in range(256):
            sign = -1.0 if code & 0x80 else 1.0
            exp, man = (code >> 3) & 0xF, code & 7
            if exp == 0xF and man == 7:
                out.append(0.0)
            elif exp == 0:
                out.append(sign * man / 8.0 * 2.0**-6)
            else:
                out.append(sign * (1 + man / 8.0) * 2.0 ** (exp - 7))
        _VALUES = torch.tensor(out)
    return _VALUES


def dequantise(data, scales):
    """float32 values of e4m3 ``data`` [..., H] with float32 ``scales`` [..., H / 128]."""
    codes = data.view(torch.uint8) if FP8_DTYPE is not None and data.dtype == FP8_DTYPE else data
    values = e4m3_values()[codes.long()]
    shape = values.shape
    return (values.view(*shape[:-1], shape[-1] // 128, 128) * scales.unsqueeze(-1)).view(shape)
