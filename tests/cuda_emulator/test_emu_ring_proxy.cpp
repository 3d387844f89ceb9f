// The device ring producer against the real proxy (issue 47): rank 0's ring lives in host memory
// registered with cudaHostRegister (so the emulator's detector holds every kernel store into it
// to the publication rules) and is filled by emulated kernels, never by a host RingProducer;
// rank 0's real ProxyEngine drains it into real fabric writes to rank 1, whose counter flag
// rises once every write landed. Checked as tests/unit/proxy/test_proxy_engine.cpp's first case
// checks the host producer: every byte in place and every descriptor popped, posted and
// completed exactly once. Over shm, and over tcp with the reorder shim (EFA SRD semantics).
//   launch_ring_push   stream-ordered batches of 1, 5, 37, 256 (one thread per descriptor of a
//                      batch; the 256 fill the whole ring, so threads wait for the proxy);
//   ring writer        4 blocks x 64 threads each device_push() concurrently
//                      (kernels/ring_writer.cu), the head shared in the ring's header.
#include "gpu_side/cuda/ring_push.hpp"

#include "tests/cuda_emulator/emu_support.hpp"
#include "tests/cuda_emulator/kernels/ring_writer.hpp"
#include "tests/unit/proxy/proxy_pair.hpp"

#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::proxy::testing;
using namespace proxyep::cuemu_testing;
using namespace std::chrono_literals;

namespace {

constexpr size_t kBytes = 512 * 1024;
constexpr uint64_t kKernelTimeoutNs = 10'000'000'000;  // any one wait of a GPU thread
constexpr uint32_t kKey = 0;                           // rank 1 counts rank 0's writes here

struct Link {
  const char* provider;
  bool reorder;
};
constexpr std::array<Link, 2> kLinks = {Link{"shm", false}, Link{"tcp", true}};

// Rank 0's ring registered as mapped for as long as the scope lasts.
class Registered {
 public:
  explicit Registered(const HostMemory& memory) : host_(memory.host()) {
    check(cudaHostRegister(host_, memory.size(), cudaHostRegisterMapped), "cudaHostRegister");
  }
  ~Registered() { (void)cudaHostUnregister(host_); }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;

 private:
  void* host_;
};

// `count` writes from rank 0's send buffer to the same offsets of rank 1's receive buffer, back
// to back, of assorted lengths (every ninth a zero-length signal), within kBytes.
std::vector<gpu_side::Descriptor> plan_writes(size_t count, uint64_t max_length) {
  std::vector<gpu_side::Descriptor> writes;
  uint64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t length = i % 9 == 4 ? 0 : 1 + (i * 7919) % max_length;
    length = std::min<uint64_t>(length, kBytes - offset);
    writes.push_back(write_descriptor(0, offset, length, kKey, i));
    offset += length;
  }
  return writes;
}

// A ProxyPair whose rank 0 ring is the device's, its send buffer patterned and rank 1 expecting
// `count` writes under kKey.
struct DeviceRingPair {
  DeviceRingPair(const Link& link, size_t count)
      : pair(link.provider, link.reorder, kBytes, test_options(), DeviceRings{{true, false}}),
        registered(pair.rank(0).memory) {
    for (size_t i = 0; i < kBytes; ++i)
      pair.buffers(0).send[i] = fabric::testing::pattern(0, i);
    REQUIRE(pair.rank(1).bank.set_expected(0, kKey, count) == Status::ok);
  }

  gpu_side::RingHeader* header() {
    return static_cast<gpu_side::RingHeader*>(pair.rank(0).memory.host());
  }

  // Waits as test_proxy_engine.cpp does (rank 1's flag, then rank 0's quiet), then checks the
  // bytes and the counts.
  void check_delivered(const std::vector<gpu_side::Descriptor>& writes) {
    const size_t count = writes.size();
    pair.engine(1).wait_flag(pair.rank(1).bank, 0, kKey, Deadline::after_ms(20000),
                             "the device ring's writes");
    pair.engine(0).quiet(Deadline::after_ms(20000));
    const auto& recv = pair.buffers(1).recv;
    const size_t written = writes.back().src_offset + writes.back().length;
    size_t bad = 0;
    for (size_t i = 0; i < written; ++i)
      bad += recv[i] != fabric::testing::pattern(0, i);
    for (size_t i = written; i < kBytes; ++i)
      bad += recv[i] != 0;
    CHECK_MESSAGE(bad == 0, bad << " bytes differ at rank 1");
    const ThreadStats sent = pair.engine(0).stats();
    CHECK(sent.descriptors == count);  // each popped once: no duplicate, none lost
    CHECK(sent.posted == count);
    CHECK(sent.completed == count);
    CHECK(sent.bytes_posted == written);
    CHECK(sent.cq_errors == 0);
    CHECK(pair.engine(1).stats().remote == count);
    CHECK(!pair.engine(0).health().failed());
    CHECK(!pair.engine(1).health().failed());
    const gpu_side::Ring& ring = pair.rank(0).ring;
    CHECK(std::atomic_ref<uint64_t>(ring.header().producer.head).load() == count);
    CHECK(std::atomic_ref<uint64_t>(ring.header().consumer.tail).load() == count);
  }

  ProxyPair pair;
  Registered registered;
};

}  // namespace

TEST_CASE("launch_ring_push's batches become the proxy's writes, each once, every byte in place") {
  constexpr std::array<int64_t, 5> kBatches = {1, 5, 37, 256, 1};
  const std::vector<gpu_side::Descriptor> writes = plan_writes(300, 3000);
  for (const Link& link : kLinks) {
    CAPTURE(link.provider);
    CAPTURE(link.reorder);
    DeviceRingPair fixture(link, writes.size());
    const DeviceArray<gpu_side::Descriptor> descriptors(writes);
    DeviceArray<gpu_side::cuda::RingPushCounters> counters(1);
    Stream stream;
    int64_t first = 0;
    for (int64_t batch : kBatches) {
      check(gpu_side::cuda::launch_ring_push(fixture.header(), kRingSlots, counters.get(),
                                             descriptors.get() + first, batch, kKernelTimeoutNs,
                                             stream),
            "launch_ring_push");
      first += batch;
    }
    REQUIRE(first == static_cast<int64_t>(writes.size()));
    // The kernels end once the proxy freed every slot they needed; first, so that a fault the
    // detector reported fails the case now (settle() throws), not at the flag's deadline.
    REQUIRE(settle(stream, Deadline(30s)));
    fixture.check_delivered(writes);
  }
}

TEST_CASE("4 blocks x 64 threads device_push concurrently into the ring the proxy drains") {
  constexpr unsigned kBlocks = 4, kThreads = 64;
  const std::vector<gpu_side::Descriptor> writes = plan_writes(2 * kBlocks * kThreads, 1000);
  for (const Link& link : kLinks) {
    CAPTURE(link.provider);
    CAPTURE(link.reorder);
    DeviceRingPair fixture(link, writes.size());
    const DeviceArray<gpu_side::Descriptor> descriptors(writes);
    DeviceArray<uint64_t> cached_tail(1);
    DeviceArray<unsigned long long> gave_up(1);
    Stream stream;
    // The head in the ring's header, so that quiet() counts what the threads reserved.
    check(launch_ring_writer({.header = fixture.header(),
                              .capacity = kRingSlots,
                              .head = &fixture.header()->producer.head,
                              .cached_tail = cached_tail.get(),
                              .descriptors = descriptors.get(),
                              .count = static_cast<int64_t>(writes.size()),
                              .timeout_ns = kKernelTimeoutNs,
                              .gave_up = gave_up.get()},
                             kBlocks, kThreads, stream),
          "launch_ring_writer");
    REQUIRE(settle(stream, Deadline(30s)));  // first, as above
    fixture.check_delivered(writes);
    unsigned long long failed = 0;
    check(cudaMemcpy(&failed, gave_up.get(), sizeof(failed), cudaMemcpyDeviceToHost),
          "cudaMemcpy(gave_up)");
    CHECK(failed == 0);
  }
}
