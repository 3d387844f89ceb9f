// ErrorNote: the latest error message of a Status-returning object.
#include "common/error.hpp"
#include "common/error_note.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;

TEST_CASE("error note: note() returns Status::error and last() reads the latest message") {
  ErrorNote note;
  CHECK(note.last().empty());
  CHECK(note.note("first") == Status::error);
  CHECK(note.last() == "first");
  CHECK(note.note("second, longer than any small-string buffer of the library") == Status::error);
  CHECK(note.last() == "second, longer than any small-string buffer of the library");
}

TEST_CASE("error note: notes from several threads at once leave one whole message") {
  ErrorNote note;
  std::vector<std::string> messages;
  for (int t = 0; t < 4; ++t)
    messages.push_back("thread " + std::to_string(t) + " " + std::string(40 * (t + 1), 'x'));
  const std::set<std::string> known(messages.begin(), messages.end());
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!stop.load()) {
      std::string seen = note.last();
      if (!seen.empty() && known.count(seen) == 0) torn.fetch_add(1);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t)
    writers.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i)
        (void)note.note(messages[static_cast<size_t>(t)]);
    });
  for (std::thread& writer : writers)
    writer.join();
  stop = true;
  reader.join();
  CHECK(torn.load() == 0);
  CHECK(known.count(note.last()) == 1);
}
