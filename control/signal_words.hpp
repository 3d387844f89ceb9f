// SignalWords: 64-bit words in host memory that the proxy threads count up, one for every remote
// write whose immediate names the word (op control, payload = the word's index: imm_for()). A
// device stream waits on them (DeviceRuntime::wait_value, the memory registered with the
// device), so that a step replayed from a graph learns with no host thread of its own that a
// peer on another node wrote to it: a word that counts a peer's writes reaches times * n once
// that peer's n-th step of `times` writes has landed (signal_value.hpp's scaled epoch values).
//
// Counting, not flagging: completions come out unordered (SRD), so a step of several writes is
// done when all of them have been counted, whichever came last; and the words never go back, so
// every step of a replayed graph has its own value to wait for.
//
// Threads: count() from any number of proxy threads at once (an atomic add, release: what the
// write landed is published with it; a device's acquire load pairs with it). The owner reads the
// words or hands their memory to a device; it must outlive the router that counts into it.
//
// Across processes: where the proxy threads are the node daemon's
// (proxy/session/proxy_host_daemon.hpp), the words live in a memfd the client creates and its
// device waits on; the daemon maps it and counts into its own mapping (the same pages: atomics on
// shared memory work across processes).
#pragma once

#include "common/error.hpp"
#include "common/error_note.hpp"
#include "common/host_memory.hpp"
#include "control/imm_layout.hpp"

#include <cstdint>
#include <span>
#include <string>

namespace proxyep::control {

class SignalWords {
 public:
  // `count` zeroed words (1 .. imm::PayloadField::kMax + 1), 64-byte aligned; throws
  // proxyep::Error otherwise.
  explicit SignalWords(uint32_t count);
  // `count` words in `memory` (at least bytes_for(count), zeroed when it was made, as a new
  // memfd is; a mapping of another process's words is not zeroed again). Throws proxyep::Error
  // for a count out of range or memory too small.
  SignalWords(uint32_t count, HostMemory memory);
  SignalWords(const SignalWords&) = delete;
  SignalWords& operator=(const SignalWords&) = delete;

  // The immediate that makes a receiver's proxy count its word `index` (checked there).
  PROXYEP_HOST_DEVICE static constexpr uint32_t imm_for(uint32_t index) {
    return imm::encode_control(0, index);
  }

  static constexpr uint64_t bytes_for(uint32_t count) { return 8ull * count; }

  uint32_t size() const { return count_; }
  uint64_t* word(uint32_t index) const { return words() + index; }
  // The words' memory, for a device to register; its memfd (-1 on the heap), for a daemon.
  std::span<std::byte> bytes() const { return memory_.bytes(); }
  int fd() const { return memory_.fd(); }

  // One write naming word `index` landed. Status::error (last_error() says why) for an index
  // out of range.
  [[nodiscard]] Status count(uint32_t index);
  std::string last_error() const { return error_.last(); }

 private:
  uint64_t* words() const { return static_cast<uint64_t*>(memory_.host()); }

  uint32_t count_;
  HostMemory memory_;
  ErrorNote error_;
};

}  // namespace proxyep::control
