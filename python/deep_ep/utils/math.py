"""DeepEP 2.x's ``deep_ep.utils.math`` helpers that callers use around ElasticBuffer: ``align``,
``ceil_div`` and the per-token FP8 casts, on ProxyEP's FP8 dtype (``torch.float8_e4m3fn`` where
torch has it, else ``torch.uint8`` e4m3 bytes) and on any device, without ``torch.compile``.

The cast rule is DeepEP's: per token per 128 channels, amax floored at 1e-4, payload
``x * (448 / amax)`` rounded to e4m3 (nearest even, saturating at 448), scale ``amax / 448`` in
float32. ``per_token_cast_back`` also reads packed UE8M0 scales (int32, four exponents a word).
"""

import torch

from proxyep._tensors import FP8_DTYPE
from proxyep.fp8 import e4m3_values

_E4M3_MAX = 448.0


def ceil_div(x, y):
    return (x + y - 1) // y


def align(x, y):
    return ceil_div(x, y) * y


def _e4m3_encode(values):
    """float32 -> e4m3 bytes (uint8), round to nearest even, saturating at 448: a search over
    the finite codes' values, so it needs no float8 dtype."""
    table = e4m3_values()
    codes = torch.arange(256)
    finite = codes[(codes & 0x7F) != 0x7F]  # the two NaN codes out
    finite = finite[finite != 0x80]  # -0: +0 stands for zero
    order = torch.argsort(table[finite])
    sorted_values, sorted_codes = table[finite][order], finite[order]
    flat = values.clamp(-_E4M3_MAX, _E4M3_MAX).reshape(-1).to("cpu", torch.float32)
    upper = torch.searchsorted(sorted_values, flat).clamp(1, len(sorted_values) - 1)
    low, high = sorted_values[upper - 1], sorted_values[upper]
    tie = (flat - low) == (high - flat)
    high_is_even = (sorted_codes[upper] & 1) == 0
    pick_high = torch.where(tie, high_is_even, (flat - low) > (high - flat))
    chosen = torch.where(pick_high, sorted_codes[upper], sorted_codes[upper - 1])
    return chosen.to(torch.uint8).view(values.shape).to(values.device)


def per_token_cast_to_fp8(x):
    """``[m, n]`` -> (e4m3 ``[m, n]``, float32 scales ``[m, ceil(n / 128)]``)."""
    assert x.dim() == 2
    m, n = x.shape
    padded_n = align(n, 128)
    padded = torch.nn.functional.pad(x.float(), (0, padded_n - n))
    groups = padded.view(m, -1, 128)
    amax = groups.abs().amax(dim=2).clamp(min=1e-4)
    codes = _e4m3_encode(groups * (_E4M3_MAX / amax).unsqueeze(2)).view(m, padded_n)[:, :n].contiguous()
    if FP8_DTYPE is not None:
        codes = codes.view(FP8_DTYPE)
    return codes, amax / _E4M3_MAX


def per_token_cast_back(x_fp8, x_scales):
    """(e4m3 ``[m, n]``, scales) -> bfloat16 ``[m, n]``; scales float32, or int32 packs of four
    UE8M0 exponents."""
    if x_fp8.numel() == 0:
        return torch.zeros(x_fp8.shape, dtype=torch.bfloat16, device=x_fp8.device)
    assert x_fp8.dim() == 2
    m, n = x_fp8.shape
    padded_n = align(n, 128)
    codes = x_fp8.view(torch.uint8) if x_fp8.dtype != torch.uint8 else x_fp8
    values = e4m3_values().to(x_fp8.device)[codes.long()]
    values = torch.nn.functional.pad(values, (0, padded_n - n)).view(m, -1, 128)
    if x_scales.dtype == torch.int32:
        # UE8M0: each byte is a biased exponent; as a float32's exponent field it is 2^(e - 127).
        x_scales = (x_scales.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    return (values * x_scales.reshape(m, -1, 1)).view(m, padded_n)[:, :n].to(torch.bfloat16).contiguous()
