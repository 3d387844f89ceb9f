// A peer on another node: writes through the ring, the proxy and the fabric (fabric_channel.hpp).
#include "proxy/session/fabric_channel.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/imm_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace proxyep::proxy {

FabricChannel::FabricChannel(int peer, const ArenaLayout& layout, std::byte* local_arena,
                             FabricPoster& poster, bool landing, DeviceArenas* device_arenas,
                             bool peer_device_arena)
    : PeerChannel(peer, layout, local_arena),
      poster_(poster),
      landing_(landing),
      device_arenas_(device_arenas),
      peer_device_arena_(peer_device_arena && device_arenas != nullptr),
      // A session without a data area has no streams (window 0): a window of one stays unused.
      window_(std::make_unique<control::SequenceWindow>(
          std::max<uint32_t>(1, layout.remote_slots().window))),
      credits_(std::make_unique<control::SenderCredits>(
          std::max<uint32_t>(1, layout.remote_slots().window))),
      staged_at_(layout.stage_window(), kNeverPosted) {}

uint32_t FabricChannel::eager_key(int sender) const {
  return static_cast<uint32_t>(layout().sizes().ranks + sender);
}

uint32_t FabricChannel::landing_key(int sender) const {
  return static_cast<uint32_t>(3 * layout().sizes().ranks + sender);
}

uint32_t FabricChannel::release_key(int receiver) const {
  return static_cast<uint32_t>(2 * layout().sizes().ranks + receiver);
}

uint32_t FabricChannel::next_staging_slot() const {
  return static_cast<uint32_t>(credits_->posted() % layout().stage_window());
}

std::span<std::byte> FabricChannel::record_buffer(uint64_t call) {
  return {poster_.staging() + layout().staging_record(call, peer()) + kRecordWordBytes,
          layout().sizes().record_bytes - kRecordWordBytes};
}

void FabricChannel::send_record(uint64_t call, uint64_t bytes, std::string_view phase) {
  // The word travels in the same write; the counter immediate, not the word, says it landed.
  // Its bit says where the call's eager bytes and chunks went.
  const uint64_t word = (call + 1) | (sends_to_device(call) ? kDeviceRowsBit : 0);
  std::memcpy(poster_.staging() + layout().staging_record(call, peer()), &word, sizeof word);
  const int self = layout().rank();
  note_parity_write(
      call, poster_.post(peer(), layout().staging_record(call, peer()), layout().record(call, self),
                         kRecordWordBytes + bytes, call,
                         control::imm::encode_counter(call, static_cast<uint32_t>(self)), phase));
}

void FabricChannel::expect_record(uint64_t call, std::string_view phase) {
  if (poster_.counters().set_expected(call, static_cast<uint32_t>(peer()), 1) != Status::ok)
    fail(std::string(phase), "the record from rank {}: {}", peer(),
         poster_.counters().last_error());
}

bool FabricChannel::record_arrived(uint64_t call) const {
  return poster_.counters().ready(call, static_cast<uint32_t>(peer()));
}

std::byte* FabricChannel::eager_buffer(uint64_t call) {
  return poster_.staging() + layout().staging_eager(call, peer());
}

void FabricChannel::send_eager(uint64_t call, uint64_t bytes, std::string_view phase) {
  const int self = layout().rank();
  note_parity_write(call,
                    poster_.post_to(rows_region(call), peer(), layout().staging_eager(call, peer()),
                                    layout().eager_slot(call, self), bytes, call,
                                    control::imm::encode_counter(call, eager_key(self)), phase));
  count_sent(bytes);
  if (sends_to_device(call)) device_arenas_->count_send();
}

const std::byte* FabricChannel::rows_here(uint64_t call, uint64_t offset, uint64_t bytes) const {
  if (device_arenas_ == nullptr) return local() + offset;
  // The record of `call` landed (its counter said so) before its rows are read.
  uint64_t word = 0;
  std::memcpy(&word, local() + layout().record(call, peer()), sizeof word);
  return device_arenas_->received(call, (word & kDeviceRowsBit) != 0, local(), offset, bytes,
                                  peer());
}

const std::byte* FabricChannel::eager(uint64_t call) const {
  return rows_here(call, layout().eager_slot(call, peer()), layout().sizes().eager_bytes);
}

const std::byte* FabricChannel::chunk(uint64_t chunk, const SlotShape& shape) const {
  return rows_here(call_, layout().chunk_slot(layout().rank(), peer(), shape, chunk),
                   shape.slot_bytes);
}

void FabricChannel::expect_eager(uint64_t call, std::string_view phase) {
  if (poster_.counters().set_expected(call, eager_key(peer()), 1) != Status::ok)
    fail(std::string(phase), "eager rows from rank {}: {}", peer(),
         poster_.counters().last_error());
}

bool FabricChannel::eager_arrived(uint64_t call) const {
  return poster_.counters().ready(call, eager_key(peer()));
}

void FabricChannel::begin_streams(uint64_t call, std::string_view phase) {
  call_ = call;
  // Streams number their chunks across calls: this call's chunk j is receive_base_ + j.
  receive_base_ = consumed_total_;
  credited_ = 0;
  // Receivers send no credit for a call's last `window` chunks (the sender needs none, and it
  // may be gone when one would land): the peer's record of this call proved that it consumed
  // every chunk of the previous call, which is that credit.
  if (credits_->credit(static_cast<uint16_t>(credits_->posted())) != Status::ok)
    fail(std::string(phase), "stream to rank {}: {}", peer(), credits_->last_error());
}

bool FabricChannel::can_send(uint64_t, const SlotShape& shape) const {
  // The staging slot this chunk is packed into must have been read by its previous write.
  if (!poster_.retired(staged_at_[next_staging_slot()])) return false;
  // At most the stream's window in flight: chunk j lands in slot j % shape.window, and a window
  // narrower than the credits' (DeepEP's RDMA chunking, chunk_plan.hpp) would otherwise have it
  // overwrite a chunk not yet read. The receiver credits in the same window.
  return credits_->available() > 0 && credits_->posted() - credits_->acked() < shape.window;
}

std::byte* FabricChannel::send_buffer(uint64_t, const SlotShape&) {
  return poster_.chunk_slot(layout().staging_slot(peer(), next_staging_slot()));
}

uint16_t FabricChannel::take_credit(std::string_view phase) {
  uint16_t seq = 0;
  if (credits_->acquire(seq) != Status::ok)
    fail(std::string(phase), "stream to rank {}: no credit after all ({})", peer(),
         credits_->last_error());
  return seq;
}

void FabricChannel::send_chunk(uint64_t chunk, const SlotShape& shape, uint64_t bytes,
                               std::string_view phase) {
  const uint32_t slot = next_staging_slot();
  const uint16_t seq = take_credit(phase);
  const int self = layout().rank();
  staged_at_[slot] = poster_.post_chunk(
      rows_region(call_), peer(), layout().staging_slot(peer(), slot),
      layout().chunk_slot(peer(), self, shape, chunk), bytes, call_,
      control::imm::encode_stream(call_, static_cast<uint32_t>(self), seq), phase);
  count_sent(bytes);
  if (sends_to_device(call_)) device_arenas_->count_send();
}

void FabricChannel::send_chunk_from(uint64_t chunk, const SlotShape& shape, const std::byte* source,
                                    uint64_t bytes, std::string_view phase) {
  // No staging slot is read: the caller's memory stays valid until the call's quiet.
  const uint16_t seq = take_credit(phase);
  const int self = layout().rank();
  poster_.post_from_caller(
      source, rows_region(call_), peer(), layout().chunk_slot(peer(), self, shape, chunk), bytes,
      call_, control::imm::encode_stream(call_, static_cast<uint32_t>(self), seq), phase);
  count_sent(bytes);
  if (sends_to_device(call_)) device_arenas_->count_send();
}

void FabricChannel::send_chunk_in_place(uint64_t chunk, const SlotShape& shape, uint64_t x_bytes,
                                        uint64_t landing_offset, uint64_t rest_offset,
                                        uint64_t rest_bytes, std::string_view phase) {
  require(landing_, phase, "the channel to rank {} has no landing region to write", peer());
  const uint32_t slot = next_staging_slot();
  const uint16_t seq = take_credit(phase);
  const int self = layout().rank();
  const uint64_t staged = layout().staging_slot(peer(), slot);
  poster_.post_chunk(region::kLanding, peer(), staged, landing_offset, x_bytes, call_,
                     control::imm::encode_counter(call_, landing_key(self)), phase);
  // Posted second: once it has completed locally, so has the first (the engine retires a
  // ring's writes as a prefix), and the staging slot is free.
  staged_at_[slot] = poster_.post_chunk(
      rows_region(call_), peer(), staged + rest_offset,
      layout().chunk_slot(peer(), self, shape, chunk) + rest_offset, rest_bytes, call_,
      control::imm::encode_stream(call_, static_cast<uint32_t>(self), seq), phase);
  count_sent(x_bytes + rest_bytes);
}

void FabricChannel::expect_in_place(uint64_t call, uint64_t chunks, std::string_view phase) {
  if (poster_.counters().set_expected(call, landing_key(peer()), chunks) != Status::ok)
    fail(std::string(phase), "rows from rank {} into the landing region: {}", peer(),
         poster_.counters().last_error());
}

bool FabricChannel::in_place_landed(uint64_t call) const {
  return poster_.counters().ready(call, landing_key(peer()));
}

uint64_t FabricChannel::landed() const {
  return window_->tail() - receive_base_;
}

void FabricChannel::consumed(uint64_t upto, uint64_t chunks, const SlotShape& shape,
                             std::string_view phase) {
  consumed_total_ = receive_base_ + upto;
  // Only credits that unlock one of this call's chunks: the sender posts its last chunk once it
  // holds chunks - window of them, and waits for nothing after that.
  const uint64_t useful = std::min(upto, chunks > shape.window ? chunks - shape.window : 0);
  if (useful <= credited_) return;
  credited_ = useful;
  const int self = layout().rank();
  poster_.post(peer(), 0, 0, 0, call_,
               control::imm::encode_credit(call_, static_cast<uint32_t>(self),
                                           static_cast<uint16_t>(receive_base_ + useful)),
               phase);
}

std::string FabricChannel::send_progress() const {
  return fmt::format("credits for {} of {} posted", credits_->acked(), credits_->posted());
}

void FabricChannel::release(uint64_t call, std::string_view phase) {
  const int self = layout().rank();
  poster_.post(peer(), 0, 0, 0, call, control::imm::encode_counter(call + 1, release_key(self)),
               phase);
}

void FabricChannel::expect_release(uint64_t call, std::string_view phase) {
  if (poster_.counters().set_expected(call + 1, release_key(peer()), 1) != Status::ok)
    fail(std::string(phase), "the release of call {} from rank {}: {}", call, peer(),
         poster_.counters().last_error());
}

void FabricChannel::forget(uint64_t call) {
  control::CounterBank& counters = poster_.counters();
  counters.cancel_expected(call, static_cast<uint32_t>(peer()));
  counters.cancel_expected(call, eager_key(peer()));
  counters.cancel_expected(call, landing_key(peer()));
  if (call >= 1) counters.cancel_expected(call - 1, release_key(peer()));
}

bool FabricChannel::released(uint64_t call) const {
  if (!poster_.retired(parity_posted_[call % 2])) return false;
  return poster_.counters().ready(call + 1, release_key(peer()));
}

}  // namespace proxyep::proxy
