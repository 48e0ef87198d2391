// Reading Prometheus' text exposition format 0.0.4 in tests: a checker of
// the rules a scraper enforces, and the samples as a map, so tests assert
// values (and deltas between two scrapes) of exact series.
#ifndef SONDE_TESTS_TESTING_EXPOSITION_H_
#define SONDE_TESTS_TESTING_EXPOSITION_H_

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "re2/re2.h"

namespace sonde::testing {
namespace exposition_internal {

inline std::string StripCommas(std::string s) {
  while (!s.empty() && s.back() == ',') s.pop_back();
  while (!s.empty() && s.front() == ',') s.erase(0, 1);
  return s;
}

}  // namespace exposition_internal

// Checks `text` against the rules of the text format 0.0.4 that a parser
// enforces: every line ends in \n; comments are HELP or TYPE of a valid name;
// one TYPE per family, before its samples; samples are
// name{label="escaped",...} value, with a known value syntax; a family's
// samples are contiguous; histograms' buckets are cumulative, sorted by le,
// end with le="+Inf" equal to _count, and come with _sum and _count.
// Returns the problems found (empty: valid).
inline std::vector<std::string> ExpositionProblems(const std::string& text) {
  std::vector<std::string> problems;
  if (!text.empty() && text.back() != '\n') problems.push_back("no final newline");
  static const RE2 kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
  static const RE2 kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  static const RE2 kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*",?)*)\})? ([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf)|NaN))");
  static const RE2 kLe(R"(le="([^"]*)\")");
  std::map<std::string, std::string> types;
  std::set<std::string> finished;  // families whose samples have ended
  std::string current;
  // Per histogram series (labels without le): last le, last count, +Inf.
  std::map<std::string, std::pair<double, double>> buckets;
  std::map<std::string, double> inf_count, count;
  for (const std::string& line :
       std::vector<std::string>(absl::StrSplit(text, '\n', absl::SkipEmpty()))) {
    std::string type_name, type;
    if (RE2::FullMatch(line, kHelp)) continue;
    if (RE2::FullMatch(line, kType, &type_name, &type)) {
      if (types.count(type_name)) problems.push_back("second TYPE for " + type_name);
      types[type_name] = type;
      continue;
    }
    if (line[0] == '#') {
      problems.push_back("bad comment: " + line);
      continue;
    }
    std::string name, braces, labels, value_text;
    if (!RE2::FullMatch(line, kSample, &name, &braces, &labels, &value_text)) {
      problems.push_back("bad sample: " + line);
      continue;
    }
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          types[name.substr(0, name.size() - s.size())] == "histogram") {
        family = name.substr(0, name.size() - s.size());
      }
    }
    if (!types.count(family)) problems.push_back("sample before TYPE: " + line);
    if (family != current) {
      if (finished.count(family)) problems.push_back("family not contiguous: " + family);
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    if (types[family] != "histogram") continue;
    const double value = std::stod(value_text);
    if (name == family + "_bucket") {
      std::string le;
      if (!RE2::PartialMatch(labels, kLe, &le)) {
        problems.push_back("bucket without le: " + line);
        continue;
      }
      const double bound =
          le == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(le);
      std::string without_le = labels;
      RE2::GlobalReplace(&without_le, kLe, "");
      const std::string key = exposition_internal::StripCommas(without_le);
      auto it = buckets.find(key);
      if (it != buckets.end()) {
        if (!(it->second.first < bound)) problems.push_back("le not increasing: " + line);
        if (value < it->second.second) problems.push_back("buckets not cumulative: " + line);
      }
      buckets[key] = {bound, value};
      if (std::isinf(bound)) inf_count[key] = value;
    } else if (name == family + "_count") {
      count[exposition_internal::StripCommas(labels)] = value;
    }
  }
  for (const auto& [key, c] : count) {
    auto inf = inf_count.find(key);
    if (inf == inf_count.end()) {
      problems.push_back("histogram without +Inf bucket: {" + key + "}");
    } else if (inf->second != c) {
      problems.push_back("+Inf bucket differs from _count for {" + key + "}");
    }
  }
  return problems;
}

// Every sample of a valid exposition, keyed by the series as written
// (`name{label="value",...}`, or just `name`).
inline std::map<std::string, double> ExpositionSamples(const std::string& text) {
  std::map<std::string, double> out;
  for (const std::string& line :
       std::vector<std::string>(absl::StrSplit(text, '\n', absl::SkipEmpty()))) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

// A series' value, 0 when absent (a counter not yet exported).
inline double SampleOr0(const std::map<std::string, double>& samples, const std::string& series) {
  auto it = samples.find(series);
  return it == samples.end() ? 0 : it->second;
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_EXPOSITION_H_
