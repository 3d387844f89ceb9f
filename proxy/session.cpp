// Session::open, and the check that every rank opens its session with the same sizes.
#include "proxy/session.hpp"

#include "common/wire.hpp"
#include "proxy/daemon_session.hpp"
#include "proxy/in_process_session.hpp"

namespace proxyep::proxy {

namespace {

constexpr const char* kPhase = "buffer";

// The sizes as every rank sends them (little endian, common/wire.hpp):
//   u32 magic "PXSZ" | u16 version | u16 proxy mode (0 in process, 1 daemon) |
//   u64 ranks_per_node | u64 record_bytes | u64 eager_bytes | u64 eager_limit | u64 data_bytes |
//   u64 staging_bytes | u64 chunk_bytes | u32 internode (proxy::Internode)
constexpr uint32_t kSizesMagic = 0x5a535850;  // "PXSZ" read as little-endian bytes
constexpr uint16_t kSizesVersion = 4;

const char* internode_name(Internode internode) {
  return internode == Internode::hierarchical ? "hierarchical" : "per_rank";
}

struct Agreed {
  SessionSizes sizes;
  bool daemon = false;  // the proxy is the node daemon (SessionConfig::daemon_socket)
};

std::vector<uint8_t> encode(const Agreed& agreed) {
  const SessionSizes& s = agreed.sizes;
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(kSizesMagic);
  w.u16(kSizesVersion);
  w.u16(agreed.daemon ? 1 : 0);
  for (uint64_t v : {static_cast<uint64_t>(s.ranks_per_node), s.record_bytes, s.eager_bytes,
                     s.eager_limit, s.data_bytes, s.staging_bytes, s.chunk_bytes})
    w.u64(v);
  w.u32(static_cast<uint32_t>(s.internode));
  return out;
}

Agreed decode(std::span<const uint8_t> blob, int ranks, int from) {
  ByteReader r(blob, kPhase);
  require(r.u32("magic") == kSizesMagic && r.u16("version") == kSizesVersion, kPhase,
          "rank {} sent its Buffer options in another format (another ProxyEP version?)", from);
  Agreed agreed;
  agreed.daemon = r.u16("proxy mode") != 0;
  SessionSizes& s = agreed.sizes;
  s.ranks = ranks;
  s.ranks_per_node = static_cast<int>(r.u64("ranks_per_node"));
  s.record_bytes = r.u64("record_bytes");
  s.eager_bytes = r.u64("eager_bytes");
  s.eager_limit = r.u64("eager_limit");
  s.data_bytes = r.u64("data_bytes");
  s.staging_bytes = r.u64("staging_bytes");
  s.chunk_bytes = r.u64("chunk_bytes");
  const uint32_t internode = r.u32("internode");
  require(internode <= static_cast<uint32_t>(Internode::hierarchical), kPhase,
          "rank {} sent an unknown ep.internode ({})", from, internode);
  s.internode = static_cast<Internode>(internode);
  r.expect_end("Buffer options");
  return agreed;
}

// Every rank must open with the same sizes: they fix every offset (arena_layout.hpp).
void check_agreed(control::Bootstrap& bootstrap, const SessionSizes& mine, bool daemon) {
  auto all = bootstrap.allgather(encode({mine, daemon}), "buffer(options)");
  for (int r = 0; r < bootstrap.world_size(); ++r) {
    const Agreed agreed = decode(all[static_cast<size_t>(r)], mine.ranks, r);
    require(agreed.daemon == daemon, kPhase,
            "rank {} runs its proxy {}, rank {} {}: every rank must use the same proxy.mode", r,
            agreed.daemon ? "in proxyepd (proxy.mode daemon)" : "in process", bootstrap.rank(),
            daemon ? "in proxyepd" : "in process");
    const SessionSizes& theirs = agreed.sizes;
    require(theirs.internode == mine.internode, kPhase,
            "rank {} created its Buffer with ep.internode {}, rank {} with {}: every rank must "
            "use the same",
            r, internode_name(theirs.internode), bootstrap.rank(), internode_name(mine.internode));
    require(theirs == mine, kPhase,
            "rank {} created its Buffer with ranks_per_node {}, num_nvl_bytes {}, num_rdma_bytes "
            "{}, ep.chunk_bytes {}, ep.eager_bytes {} (record slots of {} bytes, eager slots of "
            "{}); rank {} with {}, {}, {}, {}, {} ({}, {}): every rank must pass the same",
            r, theirs.ranks_per_node, theirs.data_bytes, theirs.staging_bytes, theirs.chunk_bytes,
            theirs.eager_limit, theirs.record_bytes, theirs.eager_bytes, bootstrap.rank(),
            mine.ranks_per_node, mine.data_bytes, mine.staging_bytes, mine.chunk_bytes,
            mine.eager_limit, mine.record_bytes, mine.eager_bytes);
  }
}

}  // namespace

bool registers_landing(std::string_view mode, std::string_view provider) {
  if (mode != "auto") return mode == "on";
  return provider.find("efa") == std::string_view::npos &&
         provider.find("verbs") == std::string_view::npos;
}

std::unique_ptr<Session> Session::open(control::Bootstrap& bootstrap, const SessionConfig& config) {
  SessionConfig agreed = config;
  agreed.sizes.ranks = bootstrap.world_size();
  const bool daemon = !agreed.daemon_socket.empty() && agreed.sizes.spans_nodes();
  check_agreed(bootstrap, agreed.sizes, daemon);
  mark_step(config.setup_clock, "options agreed");
  if (!daemon) return std::make_unique<InProcessSession>(bootstrap, agreed);  // marks its steps
  auto session = std::make_unique<DaemonSession>(bootstrap, agreed);
  mark_step(config.setup_clock, "daemon session");
  return session;
}

}  // namespace proxyep::proxy
