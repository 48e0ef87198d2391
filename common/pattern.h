// The one regular-expression engine for every pattern a user gives Sonde
// (collections' include_regex, rules' tensor_regex, query filters): RE2,
// which matches in time linear in the input and memory bounded by the
// pattern, so no pattern can crash the collector or keep a core busy.
// Syntax: RE2's (https://github.com/google/re2/wiki/Syntax), Perl-like
// without backreferences or lookaround. Patterns are searched anywhere in
// a name (anchor with ^ and $). Immutable and thread-safe; copies share the
// compiled program.
#ifndef SONDE_COMMON_PATTERN_H_
#define SONDE_COMMON_PATTERN_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace re2 {
class RE2;
}

namespace sonde {

// Longest pattern accepted, in bytes.
inline constexpr size_t kMaxPatternBytes = 4096;
// Memory RE2 may use to compile and run one pattern.
inline constexpr int64_t kMaxPatternMemory = int64_t{4} << 20;

class Pattern {
 public:
  // InvalidArgument saying what is wrong, prefixed by `what` (e.g.
  // "include_regex"): too long, not valid RE2 syntax (lookaround and
  // backreferences are not), or too big to compile within the memory limit.
  static absl::StatusOr<Pattern> Compile(absl::string_view pattern,
                                         absl::string_view what = "regex");

  // True if the pattern matches anywhere in `text`.
  bool Search(absl::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Pattern(std::string pattern, std::shared_ptr<const re2::RE2> re)
      : pattern_(std::move(pattern)), re_(std::move(re)) {}

  std::string pattern_;
  std::shared_ptr<const re2::RE2> re_;
};

}  // namespace sonde

#endif  // SONDE_COMMON_PATTERN_H_
