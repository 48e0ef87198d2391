#include "common/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace sonde {
namespace {

TEST(Utf8, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("layer1/conv.weight"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));                 // U+00E9
  EXPECT_TRUE(IsValidUtf8("\xe2\x82\xac"));                // U+20AC
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));            // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));            // U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string("\x7f\x01", 2)));
}

TEST(Utf8, RejectsMalformedSequences) {
  EXPECT_FALSE(IsValidUtf8("\xff"));                       // never in UTF-8
  EXPECT_FALSE(IsValidUtf8("\x80"));                       // lone continuation
  EXPECT_FALSE(IsValidUtf8("\xc3"));                       // truncated
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));                   // truncated
  EXPECT_FALSE(IsValidUtf8("\xc3\x28"));                   // bad continuation
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                   // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));               // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));               // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));           // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xf8\x88\x80\x80\x80"));       // 5-byte form
}

}  // namespace
}  // namespace sonde
