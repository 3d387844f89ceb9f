"""DeepEP 2.1's own V2 EP test (``tests/elastic/test_ep.py``, deepseek-ai/DeepEP at dd758ca),
adapted to ProxyEP's ``deep_ep.ElasticBuffer`` on CPU tensors over gloo
(docs/plans/ELASTIC_BUFFER.md, section 6.1, step 7). Its checks run in its order, against the
reference in ``elastic_refs.py`` (written anew from the plan, sections 1.5 and 2); its perf part
(bench_kineto, byte counts) is dropped. Shapes are small: T = 64 tokens at most per rank (rank r
has T - r), H = 256, K = 4, E = 16; seeded scores with rank 0's experts favoured and a masked
ratio, plus a token that selects nothing.

Modes. DeepEP's grid (handle copy 1/0, alignment 128/1, FP8 1/0, 0/1/2 biases, previous event 0/1,
async 0/1, comm-stream allocation 0/1 and always 1 with a previous event: 144 cases) times
``do_cpu_sync`` 1/0 and ``deterministic`` 1/0 is 576 cases per ``allow_hybrid_mode``; CI's budget
(about 20 s a registration on 2 cores) runs MODES_PER_HYBRID = 6 of them, a fixed sample drawn
with a fixed seed (a different one per ``allow_hybrid_mode``) and redrawn until every value of
every mode appears at least once (``covering_sample``). ``allow_hybrid_mode`` runs 1 and 0;
``allow_multiple_reduction`` 1 (0: the tests at the end).

Each mode is four tests, so that what ProxyEP lacks is marked where it is, not over the whole case:
- ``test_dispatch``: items 1-4 and 7-11 of the plan's list (fresh, cached, a second dispatch when
  deterministic, the statistics dispatch).
- ``test_combine``: item 12 for the non-expanded layout, biases included: V2's reduce order
  (biases first, then each group's partial by its last top-k lane), bit for bit. The
  pre-combine data make a wrong order change the bits; a mismatch says whether the result is
  V1's order (groups ascending), the likeliest regression.
- ``test_expand``: items 1, 3, 5, 6 (every slot of a token the same row), 9, 11 and 12 for the
  expanded layout: fresh expanded dispatch and its combine.
- ``test_expand_cached``: DeepEP's cached expanded dispatch (with weights, zero padding): items
  5 (equal to the fresh one) and 6 (gaps zero).

What ElasticBuffer would refuse is marked ``refused(...)``: a strict xfail that names
``proxyep.ProxyEPError`` and the plan step (an unexpected pass fails the run, so marks come off as
features land; any other failure still fails). Nothing is marked now: every mode must pass,
``allow_multiple_reduction=False`` expanded and non-expanded included.

Adaptations: events are ProxyEP's (CPU: complete); ``num_cpu_timeout_secs`` is 20, not DeepEP's
100, so a hang fails inside the launch timeout; every rank's verdict is gathered before raising
(``Checks``), so an xfail or a failure is the same on all ranks and no rank leaves a collective
behind. DeepEP compares its second deterministic dispatch's full ``recv_x`` to the first's trimmed
one without CPU sync (shapes then differ), and at alignment 1 its full expanded weights, whose
worst-case tail is uninitialised without CPU sync; here both are trimmed to the valid rows and
slots. Statistics are checked with and without CPU sync (DeepEP: with). Rows past the received
ones in combine's input are NaN (DeepEP's are uninitialised): combine must not read them.
"""

import contextlib
import itertools
import random
from collections import namedtuple

import pytest
import torch
import torch.distributed as dist

import deep_ep
import elastic_refs as refs
import proxyep
from conftest import per_token_cast_to_fp8

T, H, K, E = 64, 256, 4, 16
MASKED_RATIO = 0.1  # lanes that select nothing, as DeepEP's --masked-ratio
UNBALANCE = 2.0  # rank 0's experts' scores in [0, 2), the others' in [0, 1): get_unbalanced_scores
MODES_PER_HYBRID = 6
SAMPLE_SEEDS = {1: 4801, 0: 4802}  # per allow_hybrid_mode

Mode = namedtuple("Mode", "handle_copy alignment fp8 num_bias previous_event async_ comm_alloc cpu_sync "
                         "deterministic")


def world():
    return dist.get_rank(), dist.get_world_size()


def align(x, a):
    return (x + a - 1) // a * a


# ---- the modes ----

def deepep_modes():
    """DeepEP's enumerate_ep_modes, in its order, times do_cpu_sync and deterministic."""
    for handle_copy, alignment, fp8, num_bias, previous_event, async_ in itertools.product(
            (1, 0), (128, 1), (1, 0), (0, 1, 2), (0, 1), (0, 1)):
        for comm_alloc in ((1,) if previous_event else (0, 1)):
            for cpu_sync, deterministic in itertools.product((1, 0), (0, 1)):
                yield Mode(handle_copy, alignment, fp8, num_bias, previous_event, async_, comm_alloc,
                           cpu_sync, deterministic)


def covering_sample(seed, count):
    """``count`` modes drawn with ``seed``, redrawn (same generator) until each value of each field
    appears: a fixed subset, the same on every rank and every run."""
    grid = list(deepep_modes())
    values = {f: {getattr(m, f) for m in grid} for f in Mode._fields}
    rng = random.Random(seed)
    while True:
        chosen = rng.sample(grid, count)
        if all({getattr(m, f) for m in chosen} == values[f] for f in Mode._fields):
            return chosen


def mode_id(hybrid, mode):
    return f"hybrid{hybrid}-" + "-".join(f"{f}{v}" for f, v in zip(
        ("copy", "align", "fp8", "bias", "prev", "async", "comm", "sync", "det"), mode))


def cases(marks_of=lambda hybrid, mode: ()):
    out = []
    for hybrid in (1, 0):
        for mode in covering_sample(SAMPLE_SEEDS[hybrid], MODES_PER_HYBRID):
            out.append(pytest.param(hybrid, mode, id=mode_id(hybrid, mode),
                                    marks=marks_of(hybrid, mode)))
    return out


def refused(reason):
    return pytest.mark.xfail(strict=True, raises=proxyep.ProxyEPError, reason=reason)


# ---- helpers ----

class Checks:
    """Collects failed checks instead of raising at the first, then raises the same verdict on
    every rank (``finish``), so a rank never leaves the others waiting in a collective."""

    def __init__(self):
        self.failed = []

    def __call__(self, ok, what):
        if not bool(ok):
            self.failed.append(what)

    @contextlib.contextmanager
    def section(self, name):
        try:
            yield
        except Exception as e:  # noqa: BLE001 - recorded, raised on every rank by finish()
            self.failed.append(f"{name}: raised {e!r}")

    def finish(self):
        if everywhere(not self.failed):  # one collective when all passed; messages only if not
            return
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, self.failed)
        lines = [f"rank {r}: {what}" for r, failed in enumerate(everyone) for what in failed]
        if lines:
            raise AssertionError(f"{len(lines)} failed: " + "; ".join(lines[:12]))


def everywhere(ok):
    """True iff ``ok`` on every rank."""
    flag = torch.tensor([1 if ok else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def as_bytes(t):
    """Bytes for bitwise comparison (column-major scales made contiguous first)."""
    return t.contiguous().view(torch.uint8)


def same(a, b):
    """Bitwise equality of tensors or (FP8, scales) tuples; shapes must agree."""
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def take(x, index):
    """``x[index]`` of a tensor or of each part of an (FP8, scales) tuple."""
    return tuple(p[index] for p in x) if isinstance(x, tuple) else x[index]


def rows(x, n):
    return take(x, slice(None, n))


def make_inputs(case_seed, mode):
    """This rank's tokens, routing and biases for one case (seeded per case and rank)."""
    rank, R = world()
    g = torch.Generator().manual_seed(case_seed * 1000 + rank)
    n = max(1, T - rank)
    scores = torch.rand(n, E, generator=g)
    scores[:, :E // R] *= UNBALANCE
    topk_weights, topk_idx = torch.topk(scores, K, dim=-1, largest=True, sorted=False)
    masked = torch.rand(n, K, generator=g) < MASKED_RATIO
    masked[0] = True  # a token that goes nowhere
    topk_idx.masked_fill_(masked, -1)
    topk_weights.masked_fill_(masked, 0)
    x = torch.randn(n, H, generator=g).to(torch.bfloat16)
    if mode.fp8:
        x = per_token_cast_to_fp8(x)
    bias = tuple(torch.randn(n, H, generator=g).to(torch.bfloat16) for _ in range(mode.num_bias))
    bias = None if not bias else bias[0] if len(bias) == 1 else bias
    return x, topk_idx.to(deep_ep.topk_idx_t), topk_weights, bias


def case_seed(hybrid, mode):
    """Inputs per case: the mode's place in DeepEP's grid, and the hybrid flag."""
    return list(deepep_modes()).index(mode) * 2 + hybrid


@pytest.fixture(scope="module")
def buffers():
    """ElasticBuffers made on first use, one per (allow_hybrid_mode, deterministic), as DeepEP's
    test builds one per run of those flags; destroyed together at the end."""
    made = {}

    def get(hybrid, deterministic, multiple_reduction=True):
        key = (hybrid, deterministic, multiple_reduction)
        if key not in made:
            made[key] = deep_ep.ElasticBuffer(
                dist.group.WORLD, num_max_tokens_per_rank=T, hidden=H, deterministic=bool(deterministic),
                allow_hybrid_mode=bool(hybrid), allow_multiple_reduction=multiple_reduction,
                prefer_overlap_with_compute=False, sl_idx=0, explicitly_destroy=True,
                num_cpu_timeout_secs=20, num_gpu_timeout_secs=100)
        return made[key]

    yield get
    for key in sorted(made):
        made[key].destroy()


def launch(buf, name, mode, **params):
    """DeepEP's launch: a previous event when the mode has one, the event waited for when async."""
    if mode.previous_event:
        params.update(previous_event=buf.capture())
    values = getattr(buf, name)(async_with_compute_stream=bool(mode.async_),
                                allocate_on_comm_stream=bool(mode.comm_alloc), **params)
    if mode.async_:
        values[-1].current_stream_wait()
    return values


def dispatch_args(buf, mode, x, topk_idx, topk_weights):
    num_sms = buf.get_theoretical_num_sms(E, K)
    return dict(x=x, topk_idx=topk_idx, topk_weights=topk_weights, num_sms=num_sms,
                num_qps=buf.get_theoretical_num_qps(num_sms), num_max_tokens_per_rank=T, num_experts=E,
                expert_alignment=mode.alignment, do_handle_copy=bool(mode.handle_copy),
                do_cpu_sync=bool(mode.cpu_sync))


def cached_args(args, handle):
    return dict(x=args["x"], num_sms=args["num_sms"], num_qps=args["num_qps"], handle=handle)


def recipes(buf, multiple_reduction=True):
    """DeepEP's (reduce_in_rank, reduce_in_scaleup) for the expanded and the non-expanded combine."""
    if not multiple_reduction:
        return (False, False), (True, False)
    hybrid = buf.allow_hybrid_mode and buf.get_logical_domain_size()[0] > 1
    return ((True, True), (True, True)) if hybrid else ((True, False), (True, False))


def own_ids(n):
    return dist.get_rank() * T + torch.arange(n)


# ---- one case: DeepEP's test_dispatch_combine body, split where ProxyEP's support differs ----

def check_dispatch(buf, hybrid, mode, multiple_reduction=True):
    """Items 1-4 and 7-11: fresh and cached non-expanded dispatch, against the reference."""
    _, R = world()
    local = E // R
    x, topk_idx, topk_weights, _ = make_inputs(case_seed(hybrid, mode), mode)
    ref_x, ref_idx, ref_w, ref_ids, ref_per_rank = refs.dispatch(x, topk_idx, topk_weights, T, E)
    scaleup = buf.get_logical_domain_size()[1]

    args = dispatch_args(buf, mode, x, topk_idx, topk_weights)
    recv_x, recv_idx, recv_w, handle, _ = launch(buf, "dispatch", mode, **args)
    cached_x, cached_idx, _, cached_handle, _ = launch(buf, "dispatch", mode, **cached_args(args, handle))
    twice = launch(buf, "dispatch", mode, **args) if mode.deterministic else None
    stats = torch.zeros(local, dtype=torch.int32)
    launch(buf, "dispatch", mode, cumulative_local_expert_recv_stats=stats, **args)

    check = Checks()
    with check.section("dispatch"):
        n = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
        # 1. the received source ids
        check(torch.equal(handle.recv_src_metadata[:n, 0].long().sort().values, ref_ids.long()),
              "1: sorted recv_src_metadata[:, 0] == reference source ids")
        # 2. handle copy
        check((topk_idx.data_ptr() != handle.topk_idx.data_ptr()) == bool(mode.handle_copy),
              "2: handle.topk_idx is a copy iff do_handle_copy")
        check((topk_idx.data_ptr() != cached_handle.topk_idx.data_ptr()) == bool(mode.handle_copy),
              "2: cached handle.topk_idx is a copy iff do_handle_copy")
        check(handle.topk_idx.data_ptr() == cached_handle.topk_idx.data_ptr(),
              "2: cached handle shares topk_idx")
        check(cached_handle is handle, "cached dispatch returns the same handle")
        rows_out = n if mode.cpu_sync else R * T
        check(recv_idx.shape[0] == rows_out,
              f"recv rows {recv_idx.shape[0]} == {rows_out} (the worst case without sync)")
        # Without CPU sync, the valid part (DeepEP trims it the same way).
        recv_x, cached_x = rows(recv_x, n), rows(cached_x, n)
        recv_idx, recv_w, cached_idx = recv_idx[:n], recv_w[:n], cached_idx[:n]
        metadata = handle.recv_src_metadata[:n]
        # 3. deterministic: a second dispatch bitwise equal
        if twice is not None:
            check(n == int(twice[3].psum_num_recv_tokens_per_scaleup_rank[-1]), "3: same n twice")
            check(same(rows(twice[0], n), recv_x), "3: recv_x twice")
            check(torch.equal(twice[1][:n], recv_idx), "3: recv_topk_idx twice")
            check(torch.equal(twice[2][:n], recv_w), "3: recv_topk_weights twice")
            check(torch.equal(twice[3].recv_src_metadata[:n, :1], metadata[:, :1]), "3: source ids twice")
        # 7. cached equals fresh
        check(same(cached_x, recv_x), "7: cached recv_x (and scales) == fresh")
        check(torch.equal(cached_idx, recv_idx), "7: cached recv_topk_idx == fresh")
        check(torch.equal(handle.dst_buffer_slot_idx, cached_handle.dst_buffer_slot_idx),
              "7: dst_buffer_slot_idx")
        check(torch.equal(handle.psum_num_recv_tokens_per_scaleup_rank,
                          cached_handle.psum_num_recv_tokens_per_scaleup_rank), "7: psum per scale-up rank")
        check(handle.num_recv_tokens_per_expert_list == cached_handle.num_recv_tokens_per_expert_list,
              "7: per-expert list")
        # 8. rows and per-expert counts (4: the statistics, which DeepEP checks here too)
        check(recv_idx.shape[0] == n == ref_idx.shape[0],
              f"8: {n} rows received, reference {ref_idx.shape[0]}")
        ref_counts = [int((ref_idx == e).sum()) for e in range(local)]
        aligned = [align(c, mode.alignment) for c in ref_counts]
        check(stats.tolist() == ref_counts, f"4: statistics {stats.tolist()} == {ref_counts}")
        check(handle.num_recv_tokens_per_expert_list == (aligned if mode.cpu_sync else []),
              "8: num_recv_tokens_per_expert_list == aligned reference counts (empty without sync)")
        # 9. psum per expert: aligned counts
        psum = [0] + handle.psum_num_recv_tokens_per_expert.tolist()
        check([psum[e + 1] - psum[e] for e in range(local)] == aligned,
              "9: psum_num_recv_tokens_per_expert")
        # 10. psum per scale-up rank: sources congruent mod num_scaleup_ranks
        psum_up = [0] + handle.psum_num_recv_tokens_per_scaleup_rank.tolist()
        check([psum_up[i + 1] - psum_up[i] for i in range(scaleup)] ==
              [sum(ref_per_rank[i::scaleup]) for i in range(scaleup)], "10: psum per scale-up rank")
        # 11. per source rank, rows sorted by source id equal the reference, bitwise
        sorted_meta = torch.sort(metadata[:, 0].long())
        for s in range(R):
            start = sum(ref_per_rank[:s])
            end = start + ref_per_rank[s]
            picked = sorted_meta.indices[start:end]
            check(torch.equal(sorted_meta.values[start:end], ref_ids[start:end].long()),
                  f"11: source {s} ids")
            masked = ref_idx[start:end] < 0
            check(torch.equal(recv_w[picked].masked_fill(masked, 0),
                              ref_w[start:end].masked_fill(masked, 0)), f"11: source {s} weights")
            check(torch.equal(recv_idx[picked], ref_idx[start:end]), f"11: source {s} topk_idx")
            check(same(take(recv_x, picked), take(ref_x, slice(start, end))), f"11: source {s} rows")
    check.finish()


def check_combine(buf, hybrid, mode, multiple_reduction=True):
    """Item 12, non-expanded: combine of DeepEP's pre-combine data, bitwise against the reference."""
    x, topk_idx, topk_weights, bias = make_inputs(case_seed(hybrid, mode), mode)
    scaleout, scaleup = buf.get_logical_domain_size()
    _, combine_recipe = recipes(buf, multiple_reduction)
    ref_y = refs.pre_combine_data(own_ids(topk_idx.shape[0]), K, H)
    ref_y[topk_idx == -1] = 0
    expected = refs.combine(ref_y, topk_idx, scaleout, scaleup, E, bias, *combine_recipe)
    v1_order = refs.combine(ref_y, topk_idx, scaleout, scaleup, E, bias, *combine_recipe,
                            order="ascending")

    args = dispatch_args(buf, mode, x, topk_idx, topk_weights)
    _, recv_idx, recv_w, handle, _ = launch(buf, "dispatch", mode, **args)
    n = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
    local_y = refs.pre_combine_data(handle.recv_src_metadata[:n, 0], K, H)
    local_y[recv_idx[:n] == -1] = 0
    combine_x = torch.full((recv_idx.shape[0], H), float("nan"), dtype=torch.bfloat16)
    combine_x[:n] = refs.ordered_accumulate(local_y)
    combined, combined_w, _ = launch(buf, "combine", mode, x=combine_x, topk_weights=recv_w, bias=bias,
                                     handle=handle, num_sms=args["num_sms"], num_qps=args["num_qps"])

    check = Checks()
    with check.section("combine"):
        check(torch.equal(combined_w, topk_weights), "12: combined weights == input weights")
        check(combined.shape == expected.shape and combined.dtype == torch.bfloat16, "12: combined shape")
    check.finish()
    if everywhere(torch.equal(combined, expected)):
        return
    # Which wrong order, if it is one: V1's (groups ascending) is what a lost V2 table gives.
    v1_everywhere = everywhere(torch.equal(combined, v1_order))
    diff = (combined.float() - expected.float()).abs().max().item()
    raise AssertionError(f"12: combined != reference on some rank (this rank's max diff {diff}); "
                         f"equal to V1's order (groups ascending) on every rank: {v1_everywhere}")


def fold_expanded(expanded, indices, valid):
    """``[n, K]`` slots -> one row per token (its first valid slot), and whether all its valid
    slots hold that same row (DeepEP's fold_expanded, with the check returned, not asserted)."""
    if isinstance(expanded, tuple):
        folded = [fold_expanded(t, indices, valid) for t in expanded]
        return tuple(f for f, _ in folded), all(ok for _, ok in folded)
    gathered = expanded[indices]
    first = valid.int().argmax(dim=1)
    folded = gathered[torch.arange(gathered.shape[0]), first]
    as_b = gathered.contiguous().view(torch.uint8).view(gathered.shape[0], gathered.shape[1], -1)
    ref_b = folded.contiguous().view(torch.uint8).view(folded.shape[0], 1, -1)
    ok = ((as_b == ref_b).all(dim=-1) | ~valid).all()
    return folded, bool(ok)


def check_expand(buf, hybrid, mode, multiple_reduction=True, cached=False):
    """Items 1, 3, 5, 6, 9, 11 and 12 for the expanded layout: fresh expanded dispatch and its
    combine. With ``cached``, DeepEP's cached expanded dispatch instead (weights, zero padding):
    items 5 (equal to the fresh one at the valid slots) and 6 (alignment gaps zero)."""
    _, R = world()
    local = E // R
    x, topk_idx, topk_weights, bias = make_inputs(case_seed(hybrid, mode), mode)
    if not cached:  # the cached checks compare with the fresh expanded dispatch only
        ref_x, ref_idx, ref_w, ref_ids, ref_per_rank = refs.dispatch(x, topk_idx, topk_weights, T, E)
        scaleout, scaleup = buf.get_logical_domain_size()
        reduced_recipe, _ = recipes(buf, multiple_reduction)
        ref_y = refs.pre_combine_data(own_ids(topk_idx.shape[0]), K, H)
        ref_y[topk_idx == -1] = 0
        expected = refs.combine(ref_y, topk_idx, scaleout, scaleup, E, bias, *reduced_recipe)

    args = dispatch_args(buf, mode, x, topk_idx, topk_weights)
    _, _, _, handle, _ = launch(buf, "dispatch", mode, **args)
    exp_args = dict(args, do_expand=True, use_tma_aligned_col_major_sf=True)
    exp_x, exp_idx, exp_w, exp_handle, _ = launch(buf, "dispatch", mode, **exp_args)
    n = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
    slots = exp_handle.recv_src_metadata[:n, 2:]
    if cached:
        cached_x, _, cached_w, _, _ = launch(
            buf, "dispatch", mode, **cached_args(args, exp_handle), topk_weights=topk_weights,
            do_expand=True, use_tma_aligned_col_major_sf=True, do_zero_padding=True)
    else:
        # One row more, for the -1 slots (DeepEP's trick); rows no slot names stay NaN.
        combine_x = torch.full((exp_w.shape[0] + 1, H), float("nan"), dtype=torch.bfloat16)
        local_y = refs.pre_combine_data(exp_handle.recv_src_metadata[:n, 0], K, H)
        combine_x[slots.flatten().long()] = local_y.view(-1, H)
        # DeepEP: expanded weights need allow_multiple_reduction.
        combine_kwargs = dict(topk_weights=exp_w) if multiple_reduction else {}
        combined, combined_w, _ = launch(buf, "combine", mode, x=combine_x[:-1], bias=bias,
                                         handle=exp_handle, num_sms=args["num_sms"],
                                         num_qps=args["num_qps"], **combine_kwargs)
        twice = launch(buf, "dispatch", mode, **exp_args) if mode.deterministic else None

    check = Checks()
    with check.section("expand"):
        valid = slots >= 0
        used = slots[valid].long()
        psum = exp_handle.psum_num_recv_tokens_per_expert.tolist()
        if cached:
            # 5. cached equals fresh at the valid slots; 6. gaps zeroed (do_zero_padding)
            check(same(take(cached_x, used), take(exp_x, used)), "5: cached expanded rows == fresh")
            check(torch.equal(cached_w[used], exp_w[used]), "5: cached expanded weights == fresh")
            for e in range(local):
                start, end = psum[e], align(psum[e], mode.alignment)
                check(not as_bytes((cached_x[0] if mode.fp8 else cached_x)[start:end]).any(),
                      f"6: expert {e} padding zero (x)")
                check(not cached_w[start:end].any(), f"6: expert {e} padding zero (weights)")
        else:
            check(n == int(exp_handle.psum_num_recv_tokens_per_scaleup_rank[-1]), "1: expand keeps n")
            check(torch.equal(exp_handle.recv_src_metadata[:n, 0].long().sort().values, ref_ids.long()),
                  "1: expanded source ids")
            if twice is not None:  # 3
                check(same(take(twice[0], used), take(exp_x, used)), "3: expanded rows twice")
                if mode.alignment == 1:  # DeepEP: the gaps' weights are not initialised otherwise
                    # Nor the worst case's tail without CPU sync: up to the last expert's end.
                    check(torch.equal(twice[2][:psum[-1]], exp_w[:psum[-1]]), "3: expanded weights twice")
            # 5. the expanded layout
            check(exp_idx is None, "5: recv_topk_idx is None when expanded")
            check(exp_handle.recv_src_metadata.shape[0] >= n, "5: metadata rows")
            # 6. every slot of a token holds the same row (DeepEP's fold_expanded)
            safe = slots.clone().long()
            safe[~valid] = 0
            folded_x, consistent = fold_expanded(exp_x, safe, valid)
            check(consistent, "6: every slot of a token holds the same row")
            folded_w = exp_w[safe]
            # 9. expanded psum: unaligned count on an aligned base
            ref_counts = [int((ref_idx == e).sum()) for e in range(local)]
            base = [0] + psum
            check([base[e + 1] - align(base[e], mode.alignment) for e in range(local)] == ref_counts,
                  "9: expanded psum per expert")
            # 11. folded rows per source rank
            sorted_meta = torch.sort(exp_handle.recv_src_metadata[:n, 0].long())
            for s in range(R):
                start = sum(ref_per_rank[:s])
                end = start + ref_per_rank[s]
                picked = sorted_meta.indices[start:end]
                masked = ref_idx[start:end] < 0
                check(torch.equal(folded_w[picked].masked_fill(masked, 0),
                                  ref_w[start:end].masked_fill(masked, 0)),
                      f"11: expanded source {s} weights")
                check(same(take(folded_x, picked), take(ref_x, slice(start, end))),
                      f"11: expanded source {s} rows")
            # 12. expanded combine
            check(torch.equal(combined, expected), "12: expanded combine == reference")
            if multiple_reduction:
                check(torch.equal(combined_w, topk_weights), "12: expanded combined weights")
    check.finish()


# ---- the tests ----

@pytest.mark.parametrize("hybrid,mode", cases())
def test_dispatch(buffers, hybrid, mode):
    check_dispatch(buffers(hybrid, mode.deterministic), hybrid, mode)


@pytest.mark.parametrize("hybrid,mode", cases())
def test_combine(buffers, hybrid, mode):
    check_combine(buffers(hybrid, mode.deterministic), hybrid, mode)


@pytest.mark.parametrize("hybrid,mode", cases())
def test_expand(buffers, hybrid, mode):
    check_expand(buffers(hybrid, mode.deterministic), hybrid, mode)


@pytest.mark.parametrize("hybrid,mode", cases())
def test_expand_cached(buffers, hybrid, mode):
    check_expand(buffers(hybrid, mode.deterministic), hybrid, mode, cached=True)


FIRST_MODE = covering_sample(SAMPLE_SEEDS[1], MODES_PER_HYBRID)[0]


@pytest.mark.parametrize("hybrid", (1, 0))
def test_without_multiple_reduction(buffers, hybrid):
    """DeepEP's --allow-multiple-reduction 0, non-expanded: the same checks, combine recipe
    (True, False) (ranks' rows, no node stage)."""
    mode = FIRST_MODE
    buf = buffers(hybrid, mode.deterministic, multiple_reduction=False)
    check_dispatch(buf, hybrid, mode, multiple_reduction=False)
    check_combine(buf, hybrid, mode, multiple_reduction=False)


@pytest.mark.parametrize("hybrid", (1, 0))
def test_expand_without_multiple_reduction(buffers, hybrid):
    """Expanded, combine recipe (False, False): each slot is its own partial, no weights (each
    slot goes home alone: integrations/elastic/slot_combine.hpp)."""
    mode = FIRST_MODE
    check_expand(buffers(hybrid, mode.deterministic, multiple_reduction=False), hybrid, mode,
                 multiple_reduction=False)


def test_cached_dispatch_with_weights(buffers):
    """DeepEP allows weights with a handle (its cached expanded dispatch passes them): the cached
    non-expanded weights equal the fresh dispatch's."""
    mode = FIRST_MODE
    buf = buffers(1, mode.deterministic)
    x, topk_idx, topk_weights, _ = make_inputs(case_seed(1, mode), mode)
    args = dispatch_args(buf, mode, x, topk_idx, topk_weights)
    _, recv_idx, recv_w, handle, _ = launch(buf, "dispatch", mode, **args)
    _, _, cached_w, _, _ = launch(buf, "dispatch", mode, **cached_args(args, handle),
                                  topk_weights=topk_weights)
    check = Checks()
    with check.section("cached weights"):
        n = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
        masked = recv_idx[:n] < 0
        check(torch.equal(cached_w[:n].masked_fill(masked, 0), recv_w[:n].masked_fill(masked, 0)),
              "cached weights == fresh")
    check.finish()
