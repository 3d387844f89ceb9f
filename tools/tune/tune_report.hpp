// What `proxyep tune` hands back: the table of every candidate it ran (the chosen row marked
// "*"; with the proxy benchmark, two more columns, filled for stage 1's rows), the same as one
// JSON document (--json), and the config file of the chosen values.
//
// The config file is a parameter file as `--config FILE` and PROXYEP_CONFIG read it
// (Registry::load_text): one JSON object of "name": value holding only the four tuned
// parameters. Nothing else goes in (no comment or provenance keys): the registry refuses a file
// with a name it does not know. Each value is checked against its parameter before the file is
// written, so a file the tune writes always loads.
#pragma once

#include "tools/tune/tune_search.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace proxyep::tools::tune {

// What was tuned for, for the table's heading and the JSON: "bench ep, 2 ranks, 1 per node, ...".
struct ReportContext {
  std::string shape;  // one line describing the EP shape and timing
  nlohmann::json shape_json;
  nlohmann::json search_json;  // the lists searched, repeats, timeout
  bool proxy_bench = false;    // stage 1 ran `bench proxy` too: its columns are shown
};

// The table: one row per candidate in the order they ran, then notes and the "chosen" line.
std::string format_table(const SearchResult& result, const ReportContext& context);
// format_table on stdout.
void print_table(const SearchResult& result, const ReportContext& context);

nlohmann::json report_json(const SearchResult& result, const ReportContext& context,
                           const std::string& output_path);

// The config file's document for `chosen` (checked against each parameter).
nlohmann::json config_document(const Candidate& chosen);

// Before the search: `path` can be written (its folder exists, it is not a folder, and it does
// not exist unless `force`). Throws proxyep::Error("tune") saying which.
void check_output(const std::string& path, bool force);

// Writes `document` to `path`: a new file (refused when one appeared meanwhile) or, with
// `force`, a replacement renamed into place (a reader never sees half a file).
void write_config(const std::string& path, const nlohmann::json& document, bool force);

}  // namespace proxyep::tools::tune
