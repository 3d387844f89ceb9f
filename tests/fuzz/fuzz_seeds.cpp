// Writes the fuzz targets' seed corpus (tests/fuzz/corpus/<target>/) with the real encoders, so
// the seeds are valid inputs of this build's formats (plus a few near misses). ctest's
// fuzz.seeds_current fails when the committed corpus differs from what this program writes; after
// a format change, regenerate it from the repository root:
//   rm -r tests/fuzz/corpus && build/sanitize/tests/fuzz/fuzz_seeds tests/fuzz/corpus
// Usage: fuzz_seeds DIR
#include "control/bootstrap_wire.hpp"
#include "fabric/region_descriptor.hpp"
#include "gpu_side/descriptor.hpp"
#include "integrations/low_latency/ll_record.hpp"
#include "integrations/normal/notify_record.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;
namespace wire = proxyep::control::wire;
namespace gs = proxyep::gpu_side;
namespace normal = proxyep::integrations::normal;
namespace ll = proxyep::integrations::low_latency;
using Bytes = std::vector<uint8_t>;

namespace {

fs::path g_root;

void seed(const char* target, const char* name, const Bytes& bytes) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + (dir / name).string());
}

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& part : parts)
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

Bytes text(std::string_view s) {
  return {s.begin(), s.end()};
}

Bytes head(const Bytes& bytes, size_t count) {
  return {bytes.begin(), bytes.begin() + count};
}

// bootstrap_wire: the first byte picks the decoder (0 header, 1 contribution, 2 list,
// 3 challenge, 4 hello, 5 welcome).
void bootstrap_wire() {
  wire::Header hello;
  hello.kind = wire::Kind::hello;
  hello.rank = 3;
  hello.aux = 4;
  const Bytes hello_frame = wire::encode_frame(hello, wire::as_bytes("pid 4242 on host node-a"));
  seed("bootstrap_wire", "header_hello", cat({{0}, hello_frame}));
  wire::Header result;
  result.kind = wire::Kind::result;
  result.op = wire::Op::broadcast;
  result.seq = 7;
  result.aux = 2;
  seed("bootstrap_wire", "header_result", cat({{0}, wire::encode_frame(result, Bytes(16, 0xab))}));
  Bytes bad_magic = wire::encode_frame(result, {});
  bad_magic[0] ^= 0xff;
  seed("bootstrap_wire", "header_bad_magic", cat({{0}, bad_magic}));
  seed("bootstrap_wire", "header_truncated", cat({{0}, head(hello_frame, 20)}));

  const Bytes contribution =
      wire::encode_contribution("fabric.addresses", Bytes{1, 2, 3, 4, 5, 6, 7, 8});
  seed("bootstrap_wire", "contribution", cat({{1}, contribution}));
  seed("bootstrap_wire", "contribution_empty", cat({{1}, wire::encode_contribution("", {})}));
  seed("bootstrap_wire", "contribution_truncated", cat({{1}, head(contribution, 10)}));

  const Bytes list = wire::encode_list({Bytes{1, 2, 3}, Bytes{}, text("rank two")});
  seed("bootstrap_wire", "list", cat({{2}, list}));
  seed("bootstrap_wire", "list_empty", cat({{2}, wire::encode_list({})}));
  seed("bootstrap_wire", "list_trailing", cat({{2}, list, {0}}));

  wire::Challenge challenge;
  challenge.secret_required = true;
  challenge.nonce.fill(0x5a);
  challenge.job_id = "launch-0123456789abcdef";
  seed("bootstrap_wire", "challenge", cat({{3}, wire::encode_challenge(challenge)}));
  wire::Hello with_mac;
  with_mac.job_id = challenge.job_id;
  with_mac.nonce.fill(0x3c);
  with_mac.mac.emplace();
  with_mac.mac->fill(0xa7);
  with_mac.identity = "pid 4242 on host node-a";
  const Bytes hello_payload = wire::encode_hello(with_mac);
  seed("bootstrap_wire", "hello_mac", cat({{4}, hello_payload}));
  wire::Hello plain;
  plain.identity = "pid 7 on host node-b";
  seed("bootstrap_wire", "hello_plain", cat({{4}, wire::encode_hello(plain)}));
  seed("bootstrap_wire", "hello_truncated", cat({{4}, head(hello_payload, 30)}));
  wire::Welcome welcome;
  welcome.mac.emplace();
  welcome.mac->fill(0x11);
  seed("bootstrap_wire", "welcome", cat({{5}, wire::encode_welcome(welcome)}));
  seed("bootstrap_wire", "welcome_plain", cat({{5}, wire::encode_welcome({})}));
}

// descriptor: a 64-byte slot image, then a byte whose bit 0 recomputes the check word.
Bytes image(const gs::Descriptor& d, uint64_t seq, uint8_t fix_check) {
  const gs::WireDescriptor w = gs::encode(d, seq);
  Bytes out(gs::kDescriptorBytes + 1);
  std::memcpy(out.data(), &w, gs::kDescriptorBytes);
  out[gs::kDescriptorBytes] = fix_check;
  return out;
}

void descriptor() {
  gs::Descriptor write;
  write.op = gs::Op::write_imm;
  write.flags = gs::kFlagMore;
  write.dst_rank = 5;
  write.local_region = 1;
  write.remote_region = 2;
  write.src_offset = 4096;
  write.dst_offset = 1ull << 33;
  write.length = 14336;
  write.cookie = 99;
  write.imm = 0x40000123;
  seed("descriptor", "write_imm", image(write, 17, 0));
  gs::Descriptor signal;
  signal.op = gs::Op::signal;
  signal.dst_rank = 1;
  signal.imm = 0x80000001;
  seed("descriptor", "signal", image(signal, 1, 0));
  gs::Descriptor nop;
  nop.op = gs::Op::nop;
  seed("descriptor", "nop", image(nop, 1ull << 40, 0));
  Bytes stale = image(write, 17, 0);
  stale[0] ^= 0x10;  // another lap's sequence word under this lap's check
  seed("descriptor", "stale_seq", stale);
  Bytes wrapping = image(write, 3, 1);
  std::memset(wrapping.data() + 24, 0xff, 8);  // src_offset + length wraps; check recomputed
  seed("descriptor", "wrapping_offset", wrapping);
}

void region_descriptor() {
  proxyep::fabric::RegionDescriptor one;
  one.length = 1 << 20;
  one.rails = {{0x7f0000001000ull, 0x1234}};
  seed("region_descriptor", "one_rail", one.serialize());
  proxyep::fabric::RegionDescriptor two;
  two.length = 3ull << 32;
  two.rails = {{0, 7}, {0, 8}};
  const Bytes two_bytes = two.serialize();
  seed("region_descriptor", "two_rails", two_bytes);
  seed("region_descriptor", "truncated", head(two_bytes, two_bytes.size() - 3));
}

// notify_record: two bytes of group size minus one (little endian), then the slot's payload.
Bytes record(int ranks, const normal::RecordHeader& header, std::span<const int64_t> rows_to,
             std::span<const int32_t> experts, int32_t fabric_rows = 0) {
  normal::RecordEncoder encoder;
  encoder.begin(header, rows_to);
  std::vector<std::byte> slot(normal::record_payload_bytes(ranks));
  const uint64_t size = encoder.write(slot, experts, "fuzz_seeds", fabric_rows);
  Bytes out{static_cast<uint8_t>(ranks - 1), static_cast<uint8_t>((ranks - 1) >> 8)};
  const auto* bytes = reinterpret_cast<const uint8_t*>(slot.data());
  out.insert(out.end(), bytes, bytes + size);
  return out;
}

void notify_record() {
  normal::RecordHeader dispatch;
  dispatch.kind = normal::CallKind::dispatch;
  dispatch.num_tokens = 512;
  dispatch.format = {14336, 0, 8, 8, 1};
  dispatch.num_experts = 64;
  dispatch.expert_alignment = 1;
  // An offer of two runs of the landing region (the fitted one below the largest).
  dispatch.landing.fitted = {.offset = 4096, .bytes = 8u << 20};
  dispatch.landing.largest = {.offset = 64u << 20, .bytes = uint64_t{32} << 30};
  const std::vector<int64_t> rows4{100, 0, 37, 512};
  const std::vector<int32_t> experts(16, 9);
  const Bytes dispatch_bytes = record(4, dispatch, rows4, experts);
  seed("notify_record", "dispatch_4ranks", dispatch_bytes);
  seed("notify_record", "dispatch_truncated", head(dispatch_bytes, dispatch_bytes.size() - 6));
  // Hierarchical internode, to a counterpart: its node's expert counts (2 ranks x 16), the rows
  // it forwards (fabric_rows) and its Config's RDMA chunk sizes.
  const std::vector<int32_t> node_experts(32, 4);
  normal::RecordHeader chunked = dispatch;
  chunked.fabric_chunking = {.send_rows = 6, .recv_rows = 256};
  seed("notify_record", "dispatch_counterpart_2x2", record(4, chunked, rows4, node_experts, 77));
  normal::RecordHeader combine;
  combine.kind = normal::CallKind::combine;
  combine.num_tokens = 3;
  combine.format = {7168, 56, 0, 0, 0};
  combine.num_worst_tokens = 9;
  const std::vector<int64_t> rows2{3, 1};
  seed("notify_record", "combine_2ranks", record(2, combine, rows2, {}));
  const std::vector<int64_t> rows1{0};
  seed("notify_record", "cached_1rank",
       record(1, {normal::CallKind::cached_dispatch, 0, {256, 2, 1, 0, 1}, 8, 0, 0}, rows1, {}));
}

// ll_record: the slot's payload.
Bytes ll_record_bytes(const ll::LlRecord& record) {
  std::vector<std::byte> slot(ll::ll_record_payload_bytes());
  const uint64_t size = ll::encode_ll_record(record, slot, "fuzz_seeds");
  const auto* bytes = reinterpret_cast<const uint8_t*>(slot.data());
  return Bytes(bytes, bytes + size);
}

void ll_record() {
  ll::LlRecord dispatch;
  dispatch.kind = ll::LlKind::dispatch;
  dispatch.shape = {128, 7168, 64};
  dispatch.flags = ll::kFlagFp8 | ll::kFlagRoundScale;
  dispatch.eager_bytes = 7 * 7408;
  dispatch.counts = {3, 0, 4, 0, 0, 0, 0, 0};
  const Bytes dispatch_bytes = ll_record_bytes(dispatch);
  seed("ll_record", "dispatch", dispatch_bytes);
  seed("ll_record", "dispatch_truncated", head(dispatch_bytes, dispatch_bytes.size() - 5));
  ll::LlRecord combine;
  combine.kind = ll::LlKind::combine;
  combine.shape = {16, 1024, 8};
  combine.eager_bytes = 2048 * 5;
  seed("ll_record", "combine", ll_record_bytes(combine));
  ll::LlRecord agree;
  agree.kind = ll::LlKind::agree;
  agree.shape = {48, 2048, 12};
  seed("ll_record", "agree", ll_record_bytes(agree));
}

void config() {
  seed("config", "typical",
       text(R"({"fabric.provider": "tcp", "fabric.rails": 2, "fabric.reorder": true,
  "fabric.reorder_seed": 42, "proxy.cpus": "2,3", "proxy.threads": 1,
  "bootstrap.timeout_ms": 5000, "ep.chunk_bytes": "1M", "log.level": "warn"})"));
  seed("config", "suffixes", text(R"({"fabric.cq_size": "4K", "ep.eager_bytes": "2G"})"));
  // The largest values that fit (2^63 - 2^30 with a suffix): a mutation away from overflowing.
  seed("config", "limits",
       text(R"({"ep.chunk_bytes": "8589934591G", "fabric.reorder_seed": 9223372036854775807})"));
  seed("config", "env_names", text(R"({"PROXYEP_PROXY_PIN": "off", "PROXYEP_EP_TIMEOUT_MS": 1})"));
  seed("config", "empty", text("{}"));
  seed("config", "not_an_object", text("[1, 2, {\"a\": null}]"));
  seed("config", "unknown_name", text(R"({"fabric.nosuch": 1})"));
  seed("config", "bad_value", text(R"({"fabric.rails": "two", "proxy.pin": "maybe"})"));
  seed("config", "nested", text(R"({"log.level": {"a": [1.5e3, -0.0, "x"]}})"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  try {
    bootstrap_wire();
    descriptor();
    region_descriptor();
    notify_record();
    ll_record();
    config();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
