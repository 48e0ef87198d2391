#include "tests/fuzz/patterns_fuzz.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/collections.h"
#include "common/pattern.h"
#include "re2/re2.h"
#include "rules/tensor_selector.h"
#include "tests/fuzz/fuzz_input.h"

namespace sonde::fuzz {
namespace {

std::string Show(absl::string_view s) {
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, 80)), s.size() > 80 ? "...'" : "'");
}

bool Plain(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

void CheckPattern(const std::string& pattern, const std::vector<std::string>& names) {
  absl::StatusOr<Pattern> p = Pattern::Compile(pattern, "regex");
  if (!p.ok()) {
    if (p.status().code() != absl::StatusCode::kInvalidArgument || p.status().message().empty()) {
      FuzzFail(absl::StrCat("Compile(", Show(pattern), ") answered ", p.status().ToString()));
    }
  } else if (pattern.size() > kMaxPatternBytes) {
    FuzzFail(absl::StrCat("Compile accepted a pattern of ", pattern.size(), " bytes"));
  }

  absl::StatusOr<rules::TensorSelector> selector =
      rules::TensorSelector::Create({}, pattern);
  if (!pattern.empty() && selector.ok() != p.ok()) {
    FuzzFail(absl::StrCat("TensorSelector and Pattern disagree on ", Show(pattern)));
  }
  HookConfig config;
  config.include_regex = {pattern};
  absl::StatusOr<CollectionSet> collections = CollectionSet::Create(config);
  if (collections.ok() != p.ok()) {
    FuzzFail(absl::StrCat("CollectionSet and Pattern disagree on ", Show(pattern), ": ",
                          collections.status().ToString()));
  }
  if (!p.ok()) return;

  for (const std::string& name : names) {
    const bool found = p->Search(name);
    if (p->Search(name) != found) FuzzFail("Search is not deterministic");
    if (Plain(pattern) && found != (name.find(pattern) != std::string::npos)) {
      FuzzFail(absl::StrCat("plain ", Show(pattern), " in ", Show(name), ": Search says ", found));
    }
    if (selector.ok() && !pattern.empty()) {
      v1::TensorRecord record;
      record.set_tensor_name(name);
      if (selector->MatchesUncached(record) != found || selector->Matches(record) != found) {
        FuzzFail(absl::StrCat("TensorSelector and Search disagree on ", Show(name)));
      }
    }
    const std::vector<std::string>& members = collections->Members(name);
    const bool in_default =
        std::find(members.begin(), members.end(), "default") != members.end();
    if (in_default != found) {
      FuzzFail(absl::StrCat("include_regex ", Show(pattern), " and Search disagree on ",
                            Show(name)));
    }
    if (name.size() <= 1024) {
      const std::string exact = absl::StrCat("^", RE2::QuoteMeta(name), "$");
      absl::StatusOr<Pattern> e = Pattern::Compile(exact);
      if (e.ok() && !e->Search(name)) {
        FuzzFail(absl::StrCat("the quoted name does not find ", Show(name)));
      }
    }
  }
}

}  // namespace

int FuzzPatterns(const uint8_t* data, size_t size) {
  FuzzReader in(data, size);
  std::string pattern;
  std::vector<std::string> names;
  bool have_pattern = false;
  FuzzReader::Record r;
  while (in.NextRecord(r)) {
    if (r.control == kPatternRecord) {
      if (have_pattern) CheckPattern(pattern, names);
      pattern = std::string(r.bytes);
      names.clear();
      have_pattern = true;
    } else if (names.size() < 64) {
      names.emplace_back(r.bytes);
    }
  }
  if (have_pattern) CheckPattern(pattern, names);
  return 0;
}

}  // namespace sonde::fuzz
