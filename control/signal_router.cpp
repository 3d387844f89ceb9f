#include "control/signal_router.hpp"

#include <fmt/format.h>

namespace proxyep::control {

namespace {
const char* op_name(imm::Op op) {
  switch (op) {
    case imm::Op::counter:
      return "counter";
    case imm::Op::stream:
      return "stream";
    case imm::Op::credit:
      return "credit";
    case imm::Op::control:
      return "control";
  }
  return "?";
}

std::string describe(uint32_t raw) {
  imm::Decoded d = imm::decode(raw);
  switch (d.op()) {
    case imm::Op::counter:
      return fmt::format("imm {:#010x} (counter, epoch tag {}, key {})", raw, d.epoch_tag(),
                         d.key());
    case imm::Op::stream:
    case imm::Op::credit:
      return fmt::format("imm {:#010x} ({}, stream {}, seq {})", raw, op_name(d.op()), d.stream(),
                         d.seq());
    case imm::Op::control:
      break;
  }
  return fmt::format("imm {:#010x} (control, epoch tag {}, payload {:#x})", raw, d.epoch_tag(),
                     d.payload());
}
}  // namespace

SignalRouter::SignalRouter()
    : streams_(imm::kMaxStreams, nullptr), credits_(imm::kMaxStreams, nullptr) {}

void SignalRouter::attach_counters(CounterBank& counters) {
  require(counters_ == nullptr, "control.signal_router", "a counter bank is already attached");
  counters_ = &counters;
}

void SignalRouter::attach_stream(uint32_t stream, SequenceWindow& window) {
  require(stream < imm::kMaxStreams, "control.signal_router",
          "stream id {} out of range (the immediate holds {})", stream, imm::kMaxStreams);
  require(streams_[stream] == nullptr, "control.signal_router",
          "a sequence window is already attached to stream {}", stream);
  streams_[stream] = &window;
}

void SignalRouter::attach_credits(uint32_t stream, SenderCredits& credits) {
  require(stream < imm::kMaxStreams, "control.signal_router",
          "stream id {} out of range (the immediate holds {})", stream, imm::kMaxStreams);
  require(credits_[stream] == nullptr, "control.signal_router",
          "sender credits are already attached to stream {}", stream);
  credits_[stream] = &credits;
}

void SignalRouter::set_control_handler(ControlHandler handler) {
  control_ = std::move(handler);
}

void SignalRouter::attach_words(SignalWords& words) {
  require(words_ == nullptr, "control.signal_router", "signal words are already attached");
  words_ = &words;
}

Status SignalRouter::route(uint32_t raw) {
  imm::Decoded d = imm::decode(raw);
  if (words_ != nullptr && d.op() == imm::Op::control) {
    Status status = words_->count(d.payload());
    return status == Status::ok ? status : note(raw, words_->last_error());
  }
  switch (d.op()) {
    case imm::Op::counter: {
      if (counters_ == nullptr) return note(raw, "no counter bank attached");
      Status status = counters_->arrive(d.epoch_tag(), d.key());
      return status == Status::ok ? status : note(raw, counters_->last_error());
    }
    case imm::Op::stream: {
      SequenceWindow* window = streams_[d.stream()];
      if (window == nullptr) return note(raw, "no sequence window attached to this stream");
      Status status = window->complete(d.seq());
      return status == Status::ok ? status : note(raw, window->last_error());
    }
    case imm::Op::credit: {
      SenderCredits* credits = credits_[d.stream()];
      if (credits == nullptr) return note(raw, "no sender credits attached to this stream");
      Status status = credits->credit(d.seq());
      return status == Status::ok ? status : note(raw, credits->last_error());
    }
    case imm::Op::control:
      break;
  }
  if (!control_) return note(raw, "no control handler set");
  Status status = control_(d.epoch_tag(), d.payload());
  return status == Status::ok ? status : note(raw, "the control handler failed");
}

Status SignalRouter::refuse(std::string what) {
  return error_.note(std::move(what));
}

Status SignalRouter::note(uint32_t raw, const std::string& what) {
  return error_.note(fmt::format("{}: {}", describe(raw), what));
}

}  // namespace proxyep::control
