#include "tools/tune/tune_search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace proxyep::tools::tune {
namespace {

// The search in progress: what ran so far and the running count for progress lines.
class Search {
 public:
  Search(const SearchSpace& space, const Runner& run,
         const std::function<void(const std::string&)>& note)
      : space_(space), run_(run), note_(note), total_(planned_runs(space)) {}

  SearchResult go() {
    std::vector<Candidate> grid;
    for (int64_t threads : space_.threads)
      for (bool pin : space_.pin) {
        Candidate c = space_.start;
        c.threads = threads;
        c.pin = pin;
        grid.push_back(c);
      }
    note_(fmt::format("stage 1/3: proxy.threads x proxy.pin, {} candidate{} (chunk {}, eager {})",
                      grid.size(), grid.size() == 1 ? "" : "s",
                      format_bytes(space_.start.chunk_bytes),
                      format_bytes(space_.start.eager_bytes)));
    auto best = stage(1, grid, std::nullopt);
    if (!best) {
      note_("stage 1/3: every candidate failed; nothing to build on");
      return std::move(result_);
    }
    best = vary(2, "ep.chunk_bytes", space_.chunk_bytes, *best,
                [](Candidate& c, int64_t v) { c.chunk_bytes = v; });
    best = vary(3, "ep.eager_bytes", space_.eager_bytes, *best,
                [](Candidate& c, int64_t v) { c.eager_bytes = v; });
    result_.chosen = best;
    return std::move(result_);
  }

 private:
  // Runs `candidates` of `stage`; the winner among them and `incumbent` (already measured).
  std::optional<size_t> stage(int number, const std::vector<Candidate>& candidates,
                              std::optional<size_t> incumbent) {
    std::vector<size_t> indices;
    if (incumbent) indices.push_back(*incumbent);
    for (const auto& candidate : candidates) {
      Outcome outcome = run_(candidate, number, ++ran_, total_);
      outcome.candidate = candidate;
      outcome.stage = number;
      indices.push_back(result_.outcomes.size());
      result_.outcomes.push_back(std::move(outcome));
    }
    auto winner = choose(result_.outcomes, indices, incumbent);
    if (winner) {
      const Outcome& best = result_.outcomes[*winner];
      note_(fmt::format("stage {}/3: best {} (p50 {:.1f} us{})", number, describe(best.candidate),
                        best.median.p50_us,
                        best.proxy && best.stage == number
                            ? fmt::format(", proxy p50 {:.2f} us", best.proxy->p50_us)
                            : ""));
    }
    return winner;
  }

  // Stage 2 or 3: one parameter over its list, the others as in `incumbent`.
  template <typename Set>
  size_t vary(int number, const char* name, const std::vector<int64_t>& values, size_t incumbent,
              Set set) {
    const Candidate base = result_.outcomes[incumbent].candidate;
    std::vector<Candidate> candidates;
    for (int64_t value : values) {
      Candidate c = base;
      set(c, value);
      if (!(c == base)) candidates.push_back(c);
    }
    if (candidates.empty()) {
      note_(fmt::format("stage {}/3: {} has one value; skipped", number, name));
      return incumbent;
    }
    note_(fmt::format("stage {}/3: {}, {} more candidate{} (with {})", number, name,
                      candidates.size(), candidates.size() == 1 ? "" : "s", describe(base)));
    // The incumbent succeeded (it won a stage), so this stage has a winner.
    return stage(number, candidates, incumbent).value_or(incumbent);
  }

  const SearchSpace& space_;
  const Runner& run_;
  const std::function<void(const std::string&)>& note_;
  const int total_;
  int ran_ = 0;
  SearchResult result_;
};

}  // namespace

int planned_runs(const SearchSpace& space) {
  return static_cast<int>(space.threads.size() * space.pin.size() + space.chunk_bytes.size() - 1 +
                          space.eager_bytes.size() - 1);
}

std::optional<size_t> choose(const std::vector<Outcome>& outcomes,
                             const std::vector<size_t>& indices, std::optional<size_t> incumbent) {
  std::optional<double> lowest;
  for (size_t i : indices)
    if (outcomes[i].ok)
      lowest = std::min(lowest.value_or(outcomes[i].median.p50_us), outcomes[i].median.p50_us);
  if (!lowest) return std::nullopt;
  const double tie_limit = *lowest * (1 + kTieFraction);
  // Among the tied: fewer threads, then the incumbent, then a proxy latency before none, the
  // lower one first, then the lower p50 (then the earlier run).
  auto key = [&](size_t i) {
    const auto& proxy = outcomes[i].proxy;
    return std::make_tuple(outcomes[i].candidate.threads, incumbent != i, !proxy.has_value(),
                           proxy ? proxy->p50_us : 0.0, outcomes[i].median.p50_us, i);
  };
  std::optional<size_t> best;
  for (size_t i : indices) {
    if (!outcomes[i].ok || outcomes[i].median.p50_us > tie_limit) continue;
    if (!best || key(i) < key(*best)) best = i;
  }
  return best;
}

SearchResult run_search(const SearchSpace& space, const Runner& run,
                        const std::function<void(const std::string&)>& note) {
  return Search(space, run, note).go();
}

}  // namespace proxyep::tools::tune
