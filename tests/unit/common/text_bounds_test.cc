#include "common/text_bounds.h"

#include <gtest/gtest.h>

namespace shardtrain {
namespace {

TEST(TextBoundsTest, TruncateKeepsShortTextAndCutsLongTextWithDots) {
  EXPECT_EQ(Truncate("abc", 3), "abc");
  EXPECT_EQ(Truncate("abcd", 3), "abc...");
  EXPECT_EQ(Truncate(std::string(1 << 20, 'x')).size(), kMaxEchoBytes + 3);
}

TEST(TextBoundsTest, TruncateNeverSplitsAUtf8Character) {
  // "é" is two bytes (C3 A9): a cut after "a" + first byte backs off to "a".
  EXPECT_EQ(Truncate("a\xC3\xA9z", 2), "a...");
  EXPECT_EQ(Truncate("a\xC3\xA9z", 3), "a\xC3\xA9...");
}

TEST(TextBoundsTest, SanitizeLineReplacesControlCharactersAndBounds) {
  EXPECT_EQ(SanitizeLine("a\nb\tc\x1b[31m\x7f"
                         "d"),
            "a b c [31m d");
  const std::string long_line = SanitizeLine(std::string(5000, '\n'), 100);
  EXPECT_EQ(long_line, std::string(100, ' ') + "...");
}

}  // namespace
}  // namespace shardtrain
