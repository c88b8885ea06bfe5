// The token file and the role table (coordinator/auth.h): pure, no gRPC.
#include "coordinator/auth.h"

#include <gtest/gtest.h>

namespace shardtrain::coordinator {
namespace {

constexpr char kFile[] =
    "# comment\n"
    "\n"
    "worker-token-0123456789 worker workers\n"
    "  alice-token-0123456789   user   alice  \n"
    "admin-token-0123456789 admin root\n";

TEST(AuthenticatorTest, BearerTokensMapToTheirRoleAndName) {
  auto a = Authenticator::Parse(kFile);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->enabled());
  auto alice = a->Authenticate("Bearer alice-token-0123456789");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->role, Role::kUser);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(a->Authenticate("Bearer worker-token-0123456789")->role, Role::kWorker);
  EXPECT_EQ(a->Authenticate("Bearer admin-token-0123456789")->role, Role::kAdmin);
  for (const char* bad : {"", "alice-token-0123456789", "Bearer ", "Bearer alice-token-012345678",
                          "bearer alice-token-0123456789", "Basic alice-token-0123456789"}) {
    EXPECT_EQ(a->Authenticate(bad).status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(AuthenticatorTest, OffMeansEveryCallerIsAnAdmin) {
  Authenticator off;
  EXPECT_FALSE(off.enabled());
  auto who = off.Authenticate("");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->role, Role::kAdmin);
}

TEST(AuthenticatorTest, BadFilesAreRefusedNamingTheLine) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"tok-0123456789abcdef worker\n", "line 1"},
      {"# x\ntok-0123456789abcdef root alice\n", "line 2: role must be"},
      {"short user alice\n", "shorter than 16"},
      {"tok-0123456789abcdef user a\ntok-0123456789abcdef user b\n", "line 2: token listed twice"},
      {"# only comments\n", "no tokens"},
  };
  for (const Case& c : cases) {
    auto a = Authenticator::Parse(c.text);
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(c.want), std::string::npos) << a.status();
  }
}

TEST(AuthorizeTest, RolesMayCallTheirMethodsOnly) {
  const Principal worker{Role::kWorker, "w"}, user{Role::kUser, "alice"}, admin{Role::kAdmin, "r"};
  for (const char* m :
       {"RegisterWorker", "Heartbeat", "ReportStep", "ReportCheckpoint", "WaitCheckpointShards",
        "CommitCheckpoint", "ReportCheckpointFailure", "ReportDone", "ReportFailure", "ReportEvent",
        "KvSet", "KvGet", "KvAdd", "GetPlan"}) {
    EXPECT_TRUE(Authorize(worker, m).ok()) << m;
    EXPECT_TRUE(Authorize(admin, m).ok()) << m;
  }
  for (const char* m : {"RegisterWorker", "Heartbeat", "ReportStep", "ReportCheckpointFailure",
                        "ReportDone", "KvSet", "ListWorkers"}) {
    EXPECT_EQ(Authorize(user, m).code(), absl::StatusCode::kPermissionDenied) << m;
  }
  for (const char* m : {"SubmitJob", "ListJobs", "GetJob", "CancelJob", "WatchJob", "GetHistory"}) {
    EXPECT_TRUE(Authorize(user, m).ok()) << m;
    EXPECT_TRUE(Authorize(admin, m).ok()) << m;
  }
  for (const char* m : {"SubmitJob", "CancelJob", "ListJobs", "ListWorkers"}) {
    EXPECT_EQ(Authorize(worker, m).code(), absl::StatusCode::kPermissionDenied) << m;
  }
  EXPECT_TRUE(Authorize(admin, "ListWorkers").ok());
}

TEST(AuthorizeTest, UsersReachTheirOwnJobsOnly) {
  EXPECT_TRUE(MayAccessJob({Role::kUser, "alice"}, "j-1", "alice").ok());
  EXPECT_EQ(MayAccessJob({Role::kUser, "bob"}, "j-1", "alice").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(MayAccessJob({Role::kAdmin, "root"}, "j-1", "alice").ok());
}

TEST(LoopbackTest, OnlyLoopbackHostsCount) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "::", "10.0.0.1", "example.com", "128.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

}  // namespace
}  // namespace shardtrain::coordinator
