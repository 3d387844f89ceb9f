#include "tools/launch_output.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

namespace proxyep::tools {

void write_fully(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

LineSink prefixing_sink(bool prefix_rank0) {
  return [prefix_rank0](int rank, Stream stream, std::string_view line) {
    int fd = stream == Stream::out ? STDOUT_FILENO : STDERR_FILENO;
    if (rank == 0 && !prefix_rank0) {
      write_fully(fd, fmt::format("{}\n", line));
    } else {
      write_fully(fd, fmt::format("[rank {}] {}\n", rank, line));
    }
  };
}

void LineSplitter::feed(std::string_view bytes, const LineSink& sink) {
  while (!bytes.empty()) {
    auto newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(bytes);
      bytes = {};
    } else {
      partial_.append(bytes.substr(0, newline));
      bytes.remove_prefix(newline + 1);
      sink(rank_, stream_, partial_);
      partial_.clear();
    }
    while (partial_.size() >= kMaxLine) {
      sink(rank_, stream_, std::string_view(partial_).substr(0, kMaxLine));
      partial_.erase(0, kMaxLine);
    }
  }
}

void LineSplitter::finish(const LineSink& sink) {
  if (partial_.empty()) return;
  sink(rank_, stream_, partial_);
  partial_.clear();
}

}  // namespace proxyep::tools
