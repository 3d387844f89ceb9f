"""The metrics endpoint (PROXYEP_METRICS_PORT=0: every rank serves one on a free port): scraped over
HTTP and parsed with Prometheus' own parser (prometheus_client), its counters must move by what
the calls did. Run on 4 ranks as 2 nodes, so that every rank has node peers and fabric peers and
proxy threads."""

import urllib.request

import pytest
import torch
import torch.distributed as dist
from prometheus_client.parser import text_string_to_metric_families

import deep_ep
from conftest import ranks_per_node

T, H, K, E = 128, 512, 4, 16


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("proxyep_"):
            continue  # the HTTP server's own (exposer_scrapes_total, ...)
        for s in family.samples:
            assert s.labels["rank"] == str(dist.get_rank()), s
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "rank")))
            samples[key] = s.value
    return samples


def value(samples, name, **labels):
    return samples[(name, tuple(sorted((k, str(v)) for k, v in labels.items())))]


def total(samples, name, **labels):
    """Sum over the samples of `name` whose labels include `labels`."""
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, key), v in samples.items() if n == name and want <= set(key))


@pytest.fixture(scope="module")
def buffer():
    buf = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22,
                         explicitly_destroy=True)
    yield buf
    buf.destroy()


def one_round(buffer):
    rank, R = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    topk_idx = torch.topk(torch.randn(T, E, generator=g), K, dim=-1).indices
    topk_weights = torch.rand(T, K, generator=g)
    per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    recv_x, _, _, _, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=topk_idx,
        topk_weights=topk_weights)
    combined, _, _ = buffer.combine(recv_x, handle)
    # Each token comes back once from every rank it went to.
    assert torch.allclose(combined.float(), x.float() * in_rank.sum(dim=1, keepdim=True),
                          rtol=0.02, atol=0.02)


def test_every_rank_serves_metrics(buffer):
    assert buffer.metrics_port > 0
    samples = scrape(buffer.metrics_port)
    assert value(samples, "proxyep_proxy_threads") >= 1  # other nodes: a proxy
    assert value(samples, "proxyep_proxy_failed") == 0


def test_counters_move_by_what_the_calls_did(buffer):
    rank, R = dist.get_rank(), dist.get_world_size()
    rpn = ranks_per_node()
    node = range(rank // rpn * rpn, rank // rpn * rpn + rpn)
    # Hierarchical internode (the default on full nodes): a rank writes over the fabric only to
    # its counterparts (the ranks with its local index on the other nodes); the other ranks of
    # other nodes are reached through a node peer (path "relay").
    hierarchical = buffer.stats().internode == "hierarchical"
    fabric_peers = [r for r in range(R)
                    if r not in node and (not hierarchical or r % rpn == rank % rpn)]
    before = scrape(buffer.metrics_port)
    one_round(buffer)
    stats = buffer.stats()
    after = scrape(buffer.metrics_port)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("proxyep_calls_total", kind="dispatch") == 1
    assert delta("proxyep_calls_total", kind="combine") == 1
    assert value(after, "proxyep_calls_total", kind="dispatch") == stats.dispatch_phases.calls
    assert value(after, "proxyep_chunks_sent_total") == stats.chunks_sent
    assert value(after, "proxyep_chunks_received_total") == stats.chunks_received
    assert value(after, "proxyep_chunks_to_fabric_total") == stats.chunks_to_fabric
    assert value(after, "proxyep_chunks_sent_from_x_total") == stats.chunks_sent_from_caller
    assert delta("proxyep_call_phase_seconds_total", kind="dispatch", phase="notify") > 0
    # Bytes per peer, summed by path, are the Buffer's own totals.
    assert (total(after, "proxyep_peer_sent_bytes_total", path="node")
            + total(after, "proxyep_peer_sent_bytes_total", path="relay")) == stats.bytes_to_node
    assert total(after, "proxyep_peer_sent_bytes_total", path="fabric") == stats.bytes_to_fabric
    for peer in fabric_peers:
        assert delta("proxyep_peer_sent_bytes_total", peer=peer, path="fabric") > 0
    # Every call sends each fabric peer a record through the proxy: at least 2 descriptors per
    # peer, each posted and completed.
    assert delta("proxyep_proxy_descriptors_total") >= 2 * len(fabric_peers)
    assert delta("proxyep_proxy_writes_posted_total") >= 2 * len(fabric_peers)
    assert delta("proxyep_proxy_completions_total", side="local") >= 2 * len(fabric_peers)
    assert delta("proxyep_proxy_completions_total", side="remote") >= 2 * len(fabric_peers)
    assert total(after, "proxyep_proxy_writes_in_flight") >= 0
    # Each completed write's latency counted once; the writes' bytes cover what went to other
    # nodes; the threads were busy; no CQ error; a fresh completion from every fabric peer.
    assert delta("proxyep_proxy_write_latency_seconds_count") == delta(
        "proxyep_proxy_completions_total", side="local")
    assert delta("proxyep_proxy_write_latency_seconds_bucket", le="+Inf") == delta(
        "proxyep_proxy_write_latency_seconds_count")
    assert delta("proxyep_proxy_write_latency_seconds_sum") > 0
    assert delta("proxyep_proxy_bytes_posted_total") >= delta(
        "proxyep_peer_sent_bytes_total", path="fabric")
    assert delta("proxyep_proxy_busy_seconds_total") > 0
    assert total(after, "proxyep_proxy_cq_errors_total") == 0
    assert total(after, "proxyep_proxy_cpu_seconds_total") >= 0
    for peer in fabric_peers:
        assert 0 <= value(after, "proxyep_peer_last_completion_age_seconds", peer=peer) < 60
