#include "common/pattern.h"

#include "absl/strings/str_cat.h"
#include "re2/re2.h"

namespace sonde {

absl::StatusOr<Pattern> Pattern::Compile(absl::string_view pattern, absl::string_view what) {
  if (pattern.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", pattern.size(),
                                                   " bytes; patterns are at most ",
                                                   kMaxPatternBytes));
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(kMaxPatternMemory);
  auto re = std::make_shared<const RE2>(re2::StringPiece(pattern.data(), pattern.size()), options);
  if (!re->ok()) {
    const bool too_big = re->error_code() == RE2::ErrorPatternTooLarge;
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", pattern.substr(0, 200), pattern.size() > 200 ? "...'" : "'",
        too_big ? " is too large to compile" : " is not a valid RE2 pattern", ": ", re->error(),
        too_big ? "" : " (RE2 syntax: no lookaround or backreferences)"));
  }
  return Pattern(std::string(pattern), std::move(re));
}

bool Pattern::Search(absl::string_view text) const {
  return RE2::PartialMatch(re2::StringPiece(text.data(), text.size()), *re_);
}

}  // namespace sonde
