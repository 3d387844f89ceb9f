"""Every test module runs on each rank of a `proxyep launch` job (ctest starts them): tests are
collective, in the same order on every rank. The default process group is gloo over the launch's
rendezvous variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)."""

import contextlib
import os

import pytest
import torch
import torch.distributed as dist


def pytest_configure(config):
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(1234 + dist.get_rank())


@pytest.fixture
def world():
    return dist.get_rank(), dist.get_world_size()


@contextlib.contextmanager
def elastic_buffer(**kwargs):
    """A deep_ep.ElasticBuffer over the world group (``kwargs`` its settings), destroyed on exit:
    what the module-scoped fixtures of the ElasticBuffer tests yield."""
    import deep_ep

    buf = deep_ep.ElasticBuffer(dist.group.WORLD, explicitly_destroy=True, **kwargs)
    try:
        yield buf
    finally:
        buf.destroy()


def ranks_per_node():
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))


def calc_diff(x, y):
    """DeepEP's test dissimilarity (0 = identical), in float64."""
    x, y = x.double() + 1, y.double() + 1
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator)


def per_token_cast_to_fp8(x):
    """DeepEP's cast rule: per token per 128 channels, amax floored at 1e-4, payload
    x * (448 / amax), stored scale amax * (1 / 448) in float32 (as DeepEP's kernel computes it;
    its test's amax / 448 can differ in the last bit). Returns (e4m3 bytes as uint8 or float8,
    float32 scales [N, H/128])."""
    from proxyep import FP8_DTYPE

    n, h = x.shape
    groups = x.float().view(n, h // 128, 128)
    amax = groups.abs().amax(dim=2).clamp(min=1e-4)
    scaled = groups * (448.0 / amax).unsqueeze(2)
    codes = e4m3_encode(scaled.view(n, h))
    if FP8_DTYPE is not None:
        codes = codes.view(FP8_DTYPE)
    return codes, (amax * torch.tensor(1.0 / 448.0, dtype=torch.float32)).contiguous()


def e4m3_encode(values):
    """float32 -> e4m3 bytes (round to nearest even, saturating at 448), by table lookup over the
    256 codes: independent of the runtime's encoder."""
    table = e4m3_table()
    finite = torch.arange(256)[~torch.isnan(table)]
    finite = finite[(finite != 0x80)]  # -0: +0 stands for zero
    values_f = table[finite]
    order = torch.argsort(values_f)
    sorted_vals, sorted_codes = values_f[order], finite[order]
    v = values.clamp(-448.0, 448.0).reshape(-1)
    idx = torch.searchsorted(sorted_vals, v).clamp(1, len(sorted_vals) - 1)
    lo, hi = sorted_vals[idx - 1], sorted_vals[idx]
    pick_hi = (v - lo) > (hi - v)
    tie = (v - lo) == (hi - v)
    even_hi = (sorted_codes[idx] & 1) == 0
    choose = torch.where(tie, even_hi, pick_hi)
    codes = torch.where(choose, sorted_codes[idx], sorted_codes[idx - 1])
    return codes.to(torch.uint8).view(values.shape)


_TABLE = None


def e4m3_table():
    """The float32 value of every e4m3 byte (NaN for 0x7f/0xff)."""
    global _TABLE
    if _TABLE is None:
        out = []
        for code in range(256):
            sign = -1.0 if code & 0x80 else 1.0
            exp, man = (code >> 3) & 0xF, code & 7
            if exp == 0xF and man == 7:
                out.append(float("nan"))
            elif exp == 0:
                out.append(sign * man / 8.0 * 2.0**-6)
            else:
                out.append(sign * (1 + man / 8.0) * 2.0 ** (exp - 7))
        _TABLE = torch.tensor(out, dtype=torch.float32)
    return _TABLE


def e4m3_decode(codes):
    from proxyep import FP8_DTYPE

    if FP8_DTYPE is not None and codes.dtype == FP8_DTYPE:
        codes = codes.view(torch.uint8)
    return e4m3_table()[codes.long()]
