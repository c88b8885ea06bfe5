// Storage errors by kind (common/storage_fault.h) and what the atomic writer
// returns for each: errno mapping, codes, the carried fault and cause, free
// space; the full and read-only cases on a tmpfs of the test's own (root
// only: skipped elsewhere, saying why).
#include "common/storage_fault.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/process.h"
#include "gmock/gmock.h"

namespace shardtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(StorageFaultTest, ErrnoMapsToWhatARetryCanDo) {
  struct Case {
    int err;
    StorageFault fault;
    absl::StatusCode code;
    const char* name;
  };
  for (const Case& c : {
           Case{ENOSPC, StorageFault::kNoSpace, absl::StatusCode::kResourceExhausted, "no_space"},
           Case{EDQUOT, StorageFault::kNoSpace, absl::StatusCode::kResourceExhausted, "no_space"},
           Case{EROFS, StorageFault::kReadOnly, absl::StatusCode::kFailedPrecondition, "read_only"},
           Case{EACCES, StorageFault::kPermissionDenied, absl::StatusCode::kFailedPrecondition,
                "permission_denied"},
           Case{EPERM, StorageFault::kPermissionDenied, absl::StatusCode::kFailedPrecondition,
                "permission_denied"},
           Case{ENOTDIR, StorageFault::kNotADirectory, absl::StatusCode::kFailedPrecondition,
                "not_a_directory"},
           Case{EIO, StorageFault::kIo, absl::StatusCode::kUnavailable, "io_error"},
           Case{ETIMEDOUT, StorageFault::kIo, absl::StatusCode::kUnavailable, "io_error"},
       }) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(StorageFaultOfErrno(c.err), c.fault);
    EXPECT_EQ(RetryCannotFix(c.fault), c.fault != StorageFault::kIo);
    EXPECT_EQ(StorageFaultName(c.fault), c.name);
    const absl::Status s = ErrnoStorageError("cannot write", "/v/ck/step-20/rank-0.shard", c.err);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(StorageFaultOf(s), c.fault);
    EXPECT_EQ(StorageCause(s), std::strerror(c.err));
    EXPECT_EQ(s.message(),
              std::string("cannot write /v/ck/step-20/rank-0.shard: ") + std::strerror(c.err));
  }
  // Other errors carry no fault; their cause is their message.
  EXPECT_EQ(StorageFaultOf(absl::UnavailableError("x")), StorageFault::kNone);
  EXPECT_EQ(StorageFaultOf(absl::OkStatus()), StorageFault::kNone);
  EXPECT_EQ(StorageCause(absl::DeadlineExceededError("1 of 2 ranks")), "1 of 2 ranks");
}

TEST(StorageFaultTest, NoRoomSaysWhatItNeedsAndWhatIsFree) {
  const absl::Status s = NoRoomError("/v/final.weights", 10 << 20, 3 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(StorageFaultOf(s), StorageFault::kNoSpace);
  EXPECT_EQ(StorageCause(s), "needs 10.0 MiB, 3.0 MiB free");
  EXPECT_EQ(s.message(), "cannot write /v/final.weights: needs 10.0 MiB, 3.0 MiB free");
  EXPECT_EQ(FormatStorageBytes(512), "512 B");
  EXPECT_EQ(FormatStorageBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatStorageBytes(int64_t{3} << 30), "3.00 GiB");
}

TEST(StorageFaultTest, FreeBytesOfAPathNotMadeYetAreItsAncestorsVolumes) {
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<int64_t> here = FreeBytesAt(dir);
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_GT(*here, 0);
  absl::StatusOr<int64_t> deeper = FreeBytesAt(dir + "/not/made/yet/step-10");
  ASSERT_TRUE(deeper.ok()) << deeper.status();
  EXPECT_GT(*deeper, 0);
  EXPECT_TRUE(FreeBytesAt("relative/not/made").ok());  // the working directory's volume
  EXPECT_TRUE(CheckFreeSpace(dir + "/x", 1).ok());
  const absl::Status huge = CheckFreeSpace(dir + "/x", int64_t{1} << 60);
  EXPECT_TRUE(absl::IsResourceExhausted(huge)) << huge;
  EXPECT_THAT(StorageCause(huge), HasSubstr(" free"));
}

TEST(StorageFaultTest, WriteUnderAFileIsNotADirectory) {
  std::string tmpl = ::testing::TempDir() + "/storage_fault_test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string file = tmpl + "/ck";
  std::ofstream(file) << "a file where checkpoint.dir should be";
  const absl::Status s = WriteFileAtomically(file + "/final.weights", "w");
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(StorageFaultOf(s), StorageFault::kNotADirectory);
  EXPECT_THAT(std::string(s.message()), HasSubstr(file));
  fs::remove_all(tmpl);
}

// A tmpfs of `size` mounted on a fresh directory, unmounted and removed at
// the end; ok() false (with why) where this process may not mount.
class ScopedTmpfs {
 public:
  explicit ScopedTmpfs(const std::string& size) {
    std::string tmpl = ::testing::TempDir() + "/storage_fault_tmpfs.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      why_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    const std::string options = "size=" + size;
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      why_ = std::string("cannot mount a tmpfs here (") + std::strerror(errno) +
             "): needs root or CAP_SYS_ADMIN";
      return;
    }
    mounted_ = true;
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }
  bool RemountReadOnly() {
    return ::mount(nullptr, dir_.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

TEST(StorageFaultTest, FullVolumeIsNoSpaceAndLeavesNoTempFile) {
  ScopedTmpfs vol("64k");
  if (!vol.ok()) GTEST_SKIP() << vol.why();
  const std::string big(1 << 20, 'x');
  const absl::Status s = WriteFileAtomically(vol.dir() + "/final.weights", big);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(StorageFaultOf(s), StorageFault::kNoSpace);
  EXPECT_EQ(StorageCause(s), std::strerror(ENOSPC));
  EXPECT_TRUE(fs::is_empty(vol.dir()));  // the temp file is gone
  EXPECT_TRUE(absl::IsResourceExhausted(CheckFreeSpace(vol.dir() + "/final.weights", 1 << 20)));
}

TEST(StorageFaultTest, ReadOnlyVolumeIsReadOnly) {
  ScopedTmpfs vol("64k");
  if (!vol.ok()) GTEST_SKIP() << vol.why();
  ASSERT_TRUE(vol.RemountReadOnly()) << std::strerror(errno);
  const absl::Status s = WriteFileAtomically(vol.dir() + "/final.weights", "w");
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(StorageFaultOf(s), StorageFault::kReadOnly);
  EXPECT_EQ(StorageCause(s), std::strerror(EROFS));
}

}  // namespace
}  // namespace shardtrain
