#include "common/names.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

TEST(Names, JobNamesAreShortAndPlain) {
  SONDE_EXPECT_OK(ValidateJobName("resnet50-lr0.1_run.3"));
  EXPECT_THAT(ValidateJobName(""), StatusIs(absl::StatusCode::kInvalidArgument, "got 0"));
  EXPECT_THAT(ValidateJobName(std::string(129, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, "got 129"));
  EXPECT_THAT(ValidateJobName("a/b"), StatusIs(absl::StatusCode::kInvalidArgument, "'a/b'"));
  EXPECT_THAT(ValidateJobName("a b"), StatusIs(absl::StatusCode::kInvalidArgument, "letters"));
}

TEST(Names, DotAndDotDotAreNotJobNamesButNamesWithDotsAre) {
  EXPECT_THAT(ValidateJobName("."),
              StatusIs(absl::StatusCode::kInvalidArgument, "'.' is a directory reference"));
  EXPECT_THAT(ValidateJobName(".."),
              StatusIs(absl::StatusCode::kInvalidArgument, "'..' is a directory reference"));
  SONDE_EXPECT_OK(ValidateJobName("..."));
  SONDE_EXPECT_OK(ValidateJobName(".hidden"));
  SONDE_EXPECT_OK(ValidateJobName("run.."));
}

TEST(Names, MailAddressesArePlainNameAtDomain) {
  SONDE_EXPECT_OK(ValidateMailAddress("ops@example.com"));
  SONDE_EXPECT_OK(ValidateMailAddress("ml-team+sonde@lab.example.org"));
  for (const char* bad : {"", "ops", "@example.com", "ops@", "a@b@c", "ops @example.com",
                          "Ops <ops@example.com>", "a@b.com,c@d.com", "a@b.com;c@d.com",
                          "ops@example.com\r\nBcc: x@y.z", "\"o\"@example.com"}) {
    EXPECT_THAT(ValidateMailAddress(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, "is not a mail address"))
        << bad;
  }
  EXPECT_THAT(ValidateMailAddress("d\xc3\xa9j\xc3\xa0@example.com"),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not a mail address"));
  EXPECT_THAT(ValidateMailAddress(std::string(250, 'a') + "@b.cd"),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not a mail address"));
}

TEST(Names, TensorNamesMayHoldAnythingButNul) {
  SONDE_EXPECT_OK(ValidateTensorName("gradient/Net_fc1.weight:0 (ünïcode)"));
  EXPECT_THAT(ValidateTensorName(""),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor name is empty"));
  EXPECT_THAT(ValidateTensorName(std::string("a\0b", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, "NUL"));
  EXPECT_THAT(ValidateTensorName(std::string(1025, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, "is 1025 bytes long; the limit is 1024"));
}

}  // namespace
}  // namespace sonde
