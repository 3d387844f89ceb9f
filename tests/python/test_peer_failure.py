"""A rank whose Python code raises in the middle of a run skips its part of a collective call:
the other ranks' call fails within ep.timeout_ms (ctest sets 3 s) with a ProxyEPError naming that
rank, instead of hanging, and every process stays alive to report it."""

import time

import pytest
import torch
import torch.distributed as dist

import deep_ep

T, H, K, E = 16, 128, 2, 4


def expert_step(rank):
    if rank == 1:
        raise ValueError("a bug in rank 1's expert code")


def test_a_rank_that_raises_is_named_by_the_others():
    rank, R = dist.get_rank(), dist.get_world_size()
    buffer = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 20, num_rdma_bytes=1 << 20)
    x = torch.ones(T, H, dtype=torch.bfloat16)
    idx = torch.arange(T * K).view(T, K) % E
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, E)
    start = time.monotonic()
    if rank == 1:
        with pytest.raises(ValueError):
            expert_step(rank)  # rank 1 never reaches the dispatch below
    else:
        with pytest.raises(deep_ep.ProxyEPError, match=r"rank\(s\) 1\b|rank 1\b") as failure:
            buffer.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=torch.ones(T, K))
        assert "dispatch" in str(failure.value)
        assert time.monotonic() - start < 60
    dist.barrier()  # every process is still alive and in step with the others
