// Every user pattern goes through RE2: what it accepts, what it refuses
// with a reason, and the hostile patterns that crashed (deep nesting) or
// spun forever (catastrophic backtracking) under std::regex.
#include "common/pattern.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

TEST(PatternTest, SearchesAnywhereInTheName) {
  auto p = Pattern::Compile("fc[0-9]+\\.weight");
  SONDE_ASSERT_OK(p);
  EXPECT_TRUE(p->Search("Net_fc12.weight"));
  EXPECT_FALSE(p->Search("Net_fc.weight"));
  auto anchored = Pattern::Compile("^gradient/");
  SONDE_ASSERT_OK(anchored);
  EXPECT_TRUE(anchored->Search("gradient/Net_fc1.weight"));
  EXPECT_FALSE(anchored->Search("Net_gradient/x"));
  EXPECT_EQ(anchored->pattern(), "^gradient/");
}

TEST(PatternTest, RefusesWhatRe2DoesNotHaveWithTheReason) {
  EXPECT_THAT(Pattern::Compile("^(?!gradient).*weight", "include_regex"),
              StatusIs(absl::StatusCode::kInvalidArgument, "include_regex"));
  EXPECT_THAT(Pattern::Compile("(a)\\1"), StatusIs(absl::StatusCode::kInvalidArgument, "RE2"));
  EXPECT_THAT(Pattern::Compile("fc[1-"), StatusIs(absl::StatusCode::kInvalidArgument, "fc[1-"));
  EXPECT_THAT(Pattern::Compile(std::string(kMaxPatternBytes + 1, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most 4096"));
}

TEST(PatternTest, HostilePatternsAreAnsweredInsteadOfCrashingOrSpinning) {
  // 2,000 nested groups (4 KB): compiled or refused, never a stack overflow.
  std::string nested(2000, '(');
  nested += "a";
  nested += std::string(2000, ')');
  absl::StatusOr<Pattern> deep = Pattern::Compile(nested);
  if (deep.ok()) {
    EXPECT_TRUE(deep->Search("xa"));
  } else {
    EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument) << deep.status();
  }
  // The pattern that kept a core busy forever under std::regex: linear here.
  auto backtracking = Pattern::Compile("(t*)*x");
  SONDE_ASSERT_OK(backtracking);
  const std::string name(1024, 't');
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(backtracking->Search(name));
  // A pattern whose program outgrows the memory limit is refused, and so is
  // a repetition count RE2 does not allow.
  EXPECT_THAT(Pattern::Compile("\\pL{1000}\\pL{1000}\\pL{1000}\\pL{1000}\\pL{1000}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "too large"));
  EXPECT_THAT(Pattern::Compile("((((a{100}){100}){100}){100})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "repetition"));
}

}  // namespace
}  // namespace sonde
