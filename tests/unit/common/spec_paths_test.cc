// Spec paths against the roots they resolve in: ".." may not climb out of a
// relative path's root (submit and worker), and a confined worker refuses
// absolute paths outside its root; every refusal names the field.
#include "common/spec_paths.h"

#include <gtest/gtest.h>

namespace shardtrain {
namespace {

TEST(SpecPathsTest, RelativePathsMayNotEscapeWithDotDot) {
  for (const std::string ok : {"", "data/x.txt", "a/../x.txt", "./x", "a/b/../../x", "/abs/../x"}) {
    EXPECT_TRUE(CheckRelativePathStaysInside("data.train", ok).ok()) << ok;
  }
  for (const std::string bad : {"..", "../x", "a/../../x", "./../x", "a/b/../../../x"}) {
    const absl::Status s = CheckRelativePathStaysInside("data.train", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
    EXPECT_EQ(s.message().rfind("data.train: '" + bad + "' escapes its root", 0), 0u) << s;
  }
}

TEST(SpecPathsTest, CheckSpecPathsNamesTheFieldThatEscapes) {
  JobSpec spec;
  spec.data.train = "data/x.txt";
  spec.data.val = "data/v.txt";
  spec.checkpoint.dir = "ckpt/t";
  EXPECT_TRUE(CheckSpecPaths(spec, "ckpt/t/step-10").ok());
  EXPECT_NE(CheckSpecPaths(spec, "../ckpt").message().find("resume_from: "), std::string::npos);
  spec.checkpoint.dir = "ckpt/../../t";
  EXPECT_NE(CheckSpecPaths(spec, "").message().find("checkpoint.dir: "), std::string::npos);
  spec.data.val = "../v.txt";
  EXPECT_NE(CheckSpecPaths(spec, "").message().find("data.val: "), std::string::npos);
}

TEST(SpecPathsTest, ResolveJoinsRelativePathsAndConfinesAbsoluteOnes) {
  EXPECT_EQ(*ResolveSpecPath("checkpoint.dir", "/volume", "ckpt/a", true), "/volume/ckpt/a");
  EXPECT_EQ(*ResolveSpecPath("checkpoint.dir", "/volume/", "ckpt/a", true), "/volume/ckpt/a");
  EXPECT_EQ(*ResolveSpecPath("checkpoint.dir", "", "ckpt/a", true), "ckpt/a");
  EXPECT_EQ(*ResolveSpecPath("checkpoint.dir", "/volume", "", true), "");
  EXPECT_EQ(*ResolveSpecPath("data.train", "/volume", "/volume/d/x.txt", true), "/volume/d/x.txt");
  EXPECT_EQ(*ResolveSpecPath("data.train", "/", "/etc/x", true), "/etc/x");
  // Not confined (no --data-root given): absolute paths anywhere.
  EXPECT_EQ(*ResolveSpecPath("data.train", "/volume", "/etc/passwd", false), "/etc/passwd");
  for (const std::string bad : {"/etc/passwd", "/volume/../etc/passwd", "/volumex/a", "/"}) {
    auto r = ResolveSpecPath("data.train", "/volume", bad, true);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_EQ(r.status().message().rfind("data.train: '" + bad +
                                             "' is outside this worker's root "
                                             "/volume",
                                         0),
              0u)
        << r.status();
  }
  auto escape = ResolveSpecPath("resume_from", "/volume", "a/../../b", false);
  EXPECT_TRUE(absl::IsInvalidArgument(escape.status())) << escape.status();
}

}  // namespace
}  // namespace shardtrain
