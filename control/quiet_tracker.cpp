#include "control/quiet_tracker.hpp"

#include <fmt/format.h>

namespace proxyep::control {

QuietTracker::QuietTracker(uint64_t capacity) : window_(capacity, 0) {}

Status QuietTracker::post(Ticket& ticket) {
  uint64_t next = posted_.load(std::memory_order_relaxed);  // only this thread stores posted_
  if (next - window_.tail() >= window_.capacity()) return Status::again;
  ticket = next;
  posted_.store(next + 1, std::memory_order_release);  // partner: complete()'s acquire load
  return Status::ok;
}

Status QuietTracker::complete(Ticket ticket) {
  uint64_t posted = this->posted();  // acquire: partner of post()'s release store
  if (ticket >= posted)
    return error_.note(fmt::format(
        "completion for ticket {}, but only tickets below {} were posted", ticket, posted));
  switch (window_.mark(ticket)) {
    case PrefixWindow::Mark::ok:
      return Status::ok;
    case PrefixWindow::Mark::behind:
    case PrefixWindow::Mark::duplicate:
      return error_.note(fmt::format("ticket {} completed twice", ticket));
    case PrefixWindow::Mark::beyond:
      break;
  }
  return error_.note(fmt::format("ticket {} is beyond the retirement window (retired prefix {})",
                                 ticket, retired_prefix()));
}

uint64_t QuietTracker::outstanding(uint64_t target) const {
  uint64_t count = 0;
  for (uint64_t t = retired_prefix(); t < target; ++t)
    if (!window_.completed(t)) ++count;
  return count;
}

void QuietTracker::fail_timeout(uint64_t target, std::string_view phase) const {
  uint64_t oldest = retired_prefix();
  fail(std::string(phase),
       "quiet timed out: {} of the writes posted before ticket {} still outstanding (oldest "
       "ticket {}; {} posted, retired prefix {})",
       outstanding(target), target, oldest, posted(), oldest);
}

}  // namespace proxyep::control
