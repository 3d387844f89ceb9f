// Output of the ranks started by the local launcher (tools/launcher.hpp): each child's stdout
// and stderr arrive through pipes in arbitrary chunks; LineSplitter turns a stream into whole
// lines, and a LineSink writes each line where it belongs, normally prefixed "[rank k] ".
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace proxyep::tools {

enum class Stream { out, err };

// Receives one line of a rank's output, without its newline.
using LineSink = std::function<void(int rank, Stream stream, std::string_view line)>;

// Writes "[rank k] line\n" to our stdout or stderr (matching the child's stream) in one write(),
// so lines of different ranks never interleave mid-line. With prefix_rank0 false, rank 0's
// lines pass through unprefixed (for commands whose rank 0 prints machine-readable output).
LineSink prefixing_sink(bool prefix_rank0 = true);

// Splits a byte stream into lines. A line longer than kMaxLine is cut into kMaxLine pieces so a
// child that never prints a newline cannot grow our memory without bound.
class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  LineSplitter(int rank, Stream stream) : rank_(rank), stream_(stream) {}
  void feed(std::string_view bytes, const LineSink& sink);
  // End of stream: a last line without a newline is still delivered.
  void finish(const LineSink& sink);

 private:
  int rank_;
  Stream stream_;
  std::string partial_;
};

// Writes all of `text` to `fd`, retrying short writes; gives up silently when the reader is
// gone (a closed pipe must not stop the launcher from stopping its children).
void write_fully(int fd, std::string_view text);

}  // namespace proxyep::tools
