#include "tools/tune/tune_report.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace proxyep::tools::tune {
namespace {

nlohmann::json measurement_json(const Measurement& m) {
  return {{"p50_us", m.p50_us}, {"p99_us", m.p99_us}, {"gbps", m.gbps}};
}

nlohmann::json candidate_json(const Candidate& c) {
  return {{params::proxy_threads.name(), c.threads},
          {params::proxy_pin.name(), c.pin},
          {params::ep_chunk_bytes.name(), c.chunk_bytes},
          {params::ep_eager_bytes.name(), c.eager_bytes}};
}

// The text Registry::load_text hands the parameter for `value` (strings as they are, the rest
// as JSON spells them).
std::string loaded_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// Writes all of `text` to `fd`; false (errno set) when a write fails.
bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return fsync(fd) == 0;
}

}  // namespace

std::string format_table(const SearchResult& result, const ReportContext& context) {
  std::string out = fmt::format("proxyep tune: {}\n", context.shape);
  out += fmt::format("  {:<6}{:>14}{:>11}{:>16}{:>16}{:>9}{:>11}{:>11}", "stage", "proxy.threads",
                     "proxy.pin", "ep.chunk_bytes", "ep.eager_bytes", "GB/s", "p50 us", "p99 us");
  if (context.proxy_bench) out += fmt::format("{:>15}{:>15}", "proxy p50 us", "proxy desc/s");
  out += "\n";
  for (size_t i = 0; i < result.outcomes.size(); ++i) {
    const Outcome& o = result.outcomes[i];
    const Candidate& c = o.candidate;
    std::string row =
        fmt::format("{} {:<6}{:>14}{:>11}{:>16}{:>16}", result.chosen == i ? "*" : " ", o.stage,
                    c.threads, c.pin, format_bytes(c.chunk_bytes), format_bytes(c.eager_bytes));
    if (o.ok) {
      row += fmt::format("{:>9.2f}{:>11.1f}{:>11.1f}", o.median.gbps, o.median.p50_us,
                         o.median.p99_us);
      // Stages 2 and 3 leave the proxy columns blank (the sizes do not steer bench proxy).
      if (context.proxy_bench && o.proxy)
        row += fmt::format("{:>15.2f}{:>15.0f}", o.proxy->p50_us, o.proxy->descriptors_per_s);
      else if (context.proxy_bench && !o.proxy_error.empty())
        row += "  proxy failed: " + o.proxy_error;
    } else {
      row += "  failed: " + o.error;
    }
    out += row + "\n";
  }
  for (const auto& o : result.outcomes)
    for (const auto& note : o.notes)
      out += fmt::format("  note ({}): {}\n", describe(o.candidate), note);
  if (result.chosen) {
    const Candidate& c = result.outcomes[*result.chosen].candidate;
    out += fmt::format(
        "chosen (*): proxy.threads={} proxy.pin={} ep.chunk_bytes={} ep.eager_bytes={} "
        "(lowest dispatch+combine p50; within {:g}% fewer threads, then the incumbent{})\n",
        c.threads, c.pin, format_bytes(c.chunk_bytes), format_bytes(c.eager_bytes),
        kTieFraction * 100, context.proxy_bench ? ", then the lower proxy p50" : "");
  }
  return out;
}

void print_table(const SearchResult& result, const ReportContext& context) {
  fmt::print("{}", format_table(result, context));
}

nlohmann::json report_json(const SearchResult& result, const ReportContext& context,
                           const std::string& output_path) {
  auto candidates = nlohmann::json::array();
  for (size_t i = 0; i < result.outcomes.size(); ++i) {
    const Outcome& o = result.outcomes[i];
    nlohmann::json row = {{"stage", o.stage},
                          {"parameters", candidate_json(o.candidate)},
                          {"ok", o.ok},
                          {"chosen", result.chosen == i}};
    if (o.ok) {
      row["median"] = measurement_json(o.median);
    } else {
      row["error"] = o.error;
      row["stderr_tail"] = o.detail;
    }
    if (o.proxy)
      row["proxy"] = {{"p50_us", o.proxy->p50_us},
                      {"descriptors_per_s", o.proxy->descriptors_per_s}};
    else if (!o.proxy_error.empty())
      row["proxy"] = {{"error", o.proxy_error}, {"stderr_tail", o.proxy_detail}};
    auto runs = nlohmann::json::array();
    for (const auto& m : o.runs)
      runs.push_back(measurement_json(m));
    row["runs"] = std::move(runs);
    if (!o.notes.empty()) row["notes"] = o.notes;
    candidates.push_back(std::move(row));
  }
  nlohmann::json chosen = nullptr;
  if (result.chosen) chosen = candidate_json(result.outcomes[*result.chosen].candidate);
  return {
      {"command", "tune"},
      {"shape", context.shape_json},
      {"search", context.search_json},
      {"tie_fraction", kTieFraction},
      {"candidates", std::move(candidates)},
      {"chosen", std::move(chosen)},
      {"config_file", output_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(output_path)}};
}

nlohmann::json config_document(const Candidate& chosen) {
  nlohmann::json doc = candidate_json(chosen);
  for (const auto& [name, value] : doc.items()) {
    auto& param = config::Registry::global().at(name);
    std::string reason = param.check_text(loaded_text(value));
    require(reason.empty(), "tune", "the chosen {} = {} would be refused: {}", name,
            loaded_text(value), reason);
  }
  return doc;
}

void check_output(const std::string& path, bool force) {
  require(!path.empty(), "tune", "--output: an empty path");
  fs::path file(path);
  fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code error;
  require(fs::is_directory(folder, error), "tune", "--output {}: the folder {} does not exist",
          path, folder.string());
  require(access(folder.c_str(), W_OK) == 0, "tune", "--output {}: cannot write in {}: {}", path,
          folder.string(), std::strerror(errno));
  if (fs::exists(file, error)) {
    require(!fs::is_directory(file, error), "tune", "--output {}: is a folder", path);
    require(force, "tune", "--output {}: the file exists; pass --force to replace it", path);
  }
}

void write_config(const std::string& path, const nlohmann::json& document, bool force) {
  const std::string text = document.dump(2) + "\n";
  if (!force) {
    // O_EXCL: a file that appeared while the search ran is not overwritten either.
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    require(fd >= 0, "tune", "cannot create {}: {}{}", path, std::strerror(errno),
            errno == EEXIST ? " (pass --force to replace it)" : "");
    bool ok = write_all(fd, text);
    int write_errno = errno;
    close(fd);
    if (!ok) {
      unlink(path.c_str());
      fail("tune", "cannot write {}: {}", path, std::strerror(write_errno));
    }
    return;
  }
  fs::path file(path);
  std::string temporary = (file.has_parent_path() ? file.parent_path() / "" : fs::path()).string() +
                          "." + file.filename().string() + fmt::format(".tmp-{}", getpid());
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  require(fd >= 0, "tune", "cannot create {}: {}", temporary, std::strerror(errno));
  bool ok = write_all(fd, text);
  int write_errno = errno;
  close(fd);
  if (!ok || rename(temporary.c_str(), path.c_str()) != 0) {
    if (ok) write_errno = errno;
    unlink(temporary.c_str());
    fail("tune", "cannot write {}: {}", path, std::strerror(write_errno));
  }
}

}  // namespace proxyep::tools::tune
