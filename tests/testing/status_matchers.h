// GoogleTest matchers for absl::Status and absl::StatusOr (Debian's Abseil
// ships none): EXPECT_THAT(s, IsOk()); EXPECT_THAT(s, StatusIs(code, "substr")).
#ifndef SONDE_TESTS_TESTING_STATUS_MATCHERS_H_
#define SONDE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace sonde::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P2(StatusIs, code, substr,
           std::string("has code ") + absl::StatusCodeToString(code) +
               " and a message containing '" + std::string(substr) + "'") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         s.message().find(std::string(substr)) != absl::string_view::npos;
}

}  // namespace sonde::testing

#define SONDE_ASSERT_OK(expr) ASSERT_THAT((expr), ::sonde::testing::IsOk())
#define SONDE_EXPECT_OK(expr) EXPECT_THAT((expr), ::sonde::testing::IsOk())

#endif  // SONDE_TESTS_TESTING_STATUS_MATCHERS_H_
