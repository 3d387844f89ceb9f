"""deep_ep.Buffer(comm=<mpi4py communicator>) with no torch.distributed at all: setup data goes
through the communicator's own allgather/bcast (DeepEP's comm= for mpi4py), nodes come from its
shared-memory domains. Run under `mpirun -n 2` (tests/python/CMakeLists.txt) with --noconftest
(conftest.py would start a gloo group); helpers are imported from conftest.py and the DeepEP test
modules as plain modules. Checks: layout against a torch recomputation, every received row equal
to the row its source sent (token order kept per source), combine = token x ranks it went to,
top-k weights back; ranks_per_node=1 (every rank its own node: the internode handle); a
low-latency Buffer (per-expert counts, per-source blocks, src_info, combine); Buffers on the
communicator and on a reordered comm.Split coexisting; bad comm= arguments."""

import pytest

MPI = pytest.importorskip("mpi4py.MPI")

import torch  # noqa: E402

import deep_ep  # noqa: E402
import proxyep  # noqa: E402
from conftest import calc_diff  # noqa: E402
from test_intranode import E, K, T, make_inputs, torch_layout  # noqa: E402
import test_low_latency as ll  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, R = COMM.Get_rank(), COMM.Get_size()

pytestmark = pytest.mark.skipif(R < 2 or E % R != 0 or ll.E % R != 0,
                                reason="run under mpirun with 2, 4 or 8 ranks")


def shared_memory_size(comm):
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def normal_round(buffer, comm, seed):
    """One layout + dispatch + combine on ``buffer`` (built on ``comm``), every result checked
    against what the sources sent (gathered through ``comm``)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    assert (buffer.rank, buffer.group_size) == (rank, size)
    _, x, topk_idx, _ = make_inputs(rank, size, seed=seed)
    weights = torch.rand(T, K, generator=torch.Generator().manual_seed(seed * 7 + rank)) + 0.5
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    ref_rank, ref_expert, ref_in_rank = torch_layout(topk_idx, size)
    assert torch.equal(per_rank, ref_rank)
    assert torch.equal(per_expert, ref_expert)
    assert torch.equal(in_rank, ref_in_rank)
    recv, recv_idx, recv_w, per_expert_list, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=weights)
    sent = comm.allgather((x, topk_idx, weights, in_rank))
    # Dispatch: the rows from source s are its tokens routed here, in token order, bit-exact.
    begin = 0
    local = E // size
    for s, (xs, idx_s, w_s, in_rank_s) in enumerate(sent):
        rows = torch.nonzero(in_rank_s[:, rank]).flatten()
        n = rows.numel()
        assert torch.equal(recv[begin:begin + n], xs[rows])
        # Top-k: this rank's experts as local indices, other slots -1 with weight 0.
        mine = (idx_s[rows] >= rank * local) & (idx_s[rows] < (rank + 1) * local)
        ref_idx = torch.where(mine, idx_s[rows] - rank * local, -1)
        ref_w = torch.where(mine, w_s[rows], torch.zeros_like(w_s[rows]))
        assert torch.equal(recv_idx[begin:begin + n], ref_idx)
        assert torch.equal(recv_w[begin:begin + n], ref_w)
        begin += n
    assert recv.shape[0] == begin
    all_experts = sum(torch.bincount(idx_s[idx_s >= 0], minlength=E) for _, idx_s, _, _ in sent)
    assert per_expert_list == all_experts[rank * local:(rank + 1) * local].tolist()
    # Combine of the received rows: each token times the number of ranks it went to (a bf16 sum
    # of equal rows in float, rounded once: exact); the weights come back whole.
    combined, combined_w, _ = buffer.combine(recv, handle, topk_weights=recv_w)
    dest = in_rank.sum(dim=1, keepdim=True)
    went = in_rank.any(dim=1)
    expected = (x.float() * dest).to(torch.bfloat16)
    assert torch.equal(combined[went], expected[went])
    assert calc_diff(combined[went].float() / dest[went], x[went].float()) < 5e-6
    selected = topk_idx >= 0
    assert torch.allclose(combined_w[selected], weights[selected], rtol=0, atol=1e-6)


def test_no_torch_distributed():
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("ranks_per_node", [None, 1])
def test_normal_mode(ranks_per_node):
    buffer = deep_ep.Buffer(None, num_nvl_bytes=1 << 22, num_rdma_bytes=0, comm=COMM,
                            explicitly_destroy=True, ranks_per_node=ranks_per_node)
    # Nodes from the communicator's shared-memory domains (here: one host), or the override.
    expected_rpn = ranks_per_node or shared_memory_size(COMM)
    assert buffer.ranks_per_node == expected_rpn
    assert buffer.num_nodes == R // expected_rpn
    for seed in (1, 2):
        normal_round(buffer, COMM, seed)
    # destroy() is collective: only after success (a failing rank exits at once instead, with
    # -x and `python3 -m mpi4py`, whose MPI_Abort ends the other ranks).
    buffer.destroy()
    assert not torch.distributed.is_initialized()


def test_torchrun_variables_do_not_decide_the_nodes(monkeypatch):
    # An MPI job with stale torchrun variables (here: "one rank per node"): comm= ignores them.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", str(RANK))
    g = proxyep.rendezvous(comm=COMM)
    assert (g.rank, g.world_size, g.ranks_per_node) == (RANK, R, shared_memory_size(COMM))
    # Every rank got rank 0's address, port, job id and secret.
    root = COMM.allgather((g.master_addr, g.master_port, g.job_id, g.secret))
    assert all(r == root[0] for r in root) and len(g.secret) == 32


@pytest.mark.parametrize("use_fp8", [False, True])
def test_low_latency_mode(use_fp8):
    T_, H_, E_ = ll.T, ll.H, ll.E
    local = E_ // R
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T_, H_, R, E_)
    buffer = deep_ep.Buffer(comm=COMM, num_rdma_bytes=hint, low_latency_mode=True,
                            num_qps_per_rank=local, explicitly_destroy=True)
    for seed in (1, 2):
        x = ll.make_x(RANK)
        topk_idx, weights = ll.make_routing(RANK, seed=seed)
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, T_, E_,
                                                                use_fp8=use_fp8)
        all_idx = COMM.allgather(topk_idx)
        src_info, layout_range = handle[0], handle[1]
        values = ll.dequantised(recv, use_fp8, False)
        for e in range(local):
            expert = RANK * local + e
            assert int(count[e]) == sum(int((idx == expert).sum()) for idx in all_idx)
            for s in range(R):
                begin, n = int(layout_range[e, s] >> 32), int(layout_range[e, s] & 0xFFFFFFFF)
                tokens = src_info[e, begin:begin + n]
                expected = torch.nonzero((all_idx[s] == expert).any(dim=1)).flatten()
                assert sorted(tokens.tolist()) == expected.tolist()
                # Each row is source s's token: value s - 128, its index in the last channels.
                rows = values[e, begin:begin + n].to(torch.bfloat16).float()
                assert torch.equal(rows, ll.make_x(s)[tokens.long()].float())
        combined, _, _ = buffer.low_latency_combine(values.to(torch.bfloat16), topk_idx, weights,
                                                    handle)
        reference = x.float() * (weights * (topk_idx >= 0).float()).sum(dim=1, keepdim=True)
        assert calc_diff(combined.float(), reference) < (9e-4 if use_fp8 else 1e-5)
    buffer.destroy()


def test_buffers_on_comm_and_on_a_split_coexist():
    # The same ranks in reverse order: Buffer ranks are the subcommunicator's, not COMM_WORLD's.
    sub = COMM.Split(color=0, key=R - 1 - RANK)
    assert sub.Get_rank() == R - 1 - RANK
    world = deep_ep.Buffer(comm=COMM, num_nvl_bytes=1 << 22, explicitly_destroy=True)
    reordered = deep_ep.Buffer(comm=sub, num_nvl_bytes=1 << 22, explicitly_destroy=True)
    assert world.rank == RANK and reordered.rank == sub.Get_rank()
    # Interleaved calls on both Buffers.
    normal_round(reordered, sub, seed=3)
    normal_round(world, COMM, seed=4)
    normal_round(reordered, sub, seed=5)
    reordered.destroy()
    sub.Free()
    normal_round(world, COMM, seed=6)  # unaffected by the other Buffer and its communicator going
    world.destroy()


class OnlyRank:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1


def test_bad_comm_is_refused_clearly():
    with pytest.raises(TypeError, match="allgather, bcast"):
        deep_ep.Buffer(comm=object())
    with pytest.raises(TypeError, match="OnlyRank lacks allgather, bcast"):
        proxyep.rendezvous(comm=OnlyRank())
    with pytest.raises(ValueError, match="COMM_NULL"):
        deep_ep.Buffer(comm=MPI.COMM_NULL)
    # Without comm= and without torch.distributed: DeepEP's default group does not exist.
    with pytest.raises(RuntimeError, match="torch.distributed"):
        deep_ep.Buffer()
