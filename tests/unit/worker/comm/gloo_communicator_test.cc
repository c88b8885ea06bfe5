// Every collective of the Gloo backend, for world sizes 1, 2, 3, 4, 8 and
// every dtype, over element counts 0, 1, 7, 1000, 100003, checked against a
// reference computed locally.
#include "worker/comm/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"

namespace shardtrain::comm {
namespace {

using testing::RunRanks;
using testing::TestValue;
using testing::Tolerance;
using testing::TypedBuffer;

const size_t kCounts[] = {0, 1, 7, 1000, 100003};

struct Param {
  int world;
  DataType dtype;
};

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat("world", info.param.world, "_", DataTypeName(info.param.dtype));
}

class CollectiveTest : public ::testing::TestWithParam<Param> {};

// Rounds `v` to the test's dtype, as the backend does once at the end.
float Round(DataType dtype, float v) {
  TypedBuffer b(dtype, 1);
  b.Set(0, v);
  return b.Get(0);
}

float Reference(ReduceOp op, int world, size_t i, const std::function<float(int, size_t)>& value) {
  float acc = value(0, i);
  for (int r = 1; r < world; ++r) {
    acc = op == ReduceOp::kMax ? std::max(acc, value(r, i)) : acc + value(r, i);
  }
  if (op == ReduceOp::kAvg) acc /= static_cast<float>(world);
  return acc;
}

// Compares `got[i]` with `want(i)` within the dtype's tolerance; reports the
// max difference on failure.
void ExpectClose(const TypedBuffer& got, size_t count, DataType dtype,
                 const std::function<float(size_t)>& want, const std::string& what) {
  double max_diff = 0;
  size_t worst = 0;
  bool bad = false;
  for (size_t i = 0; i < count; ++i) {
    const float ref = Round(dtype, want(i));
    const double diff = std::fabs(static_cast<double>(got.Get(i)) - ref);
    if (diff > max_diff) {
      max_diff = diff;
      worst = i;
    }
    if (diff > Tolerance(dtype) * (1.0 + std::fabs(ref))) bad = true;
  }
  EXPECT_FALSE(bad) << what << ": max diff " << max_diff << " at element " << worst << " (got "
                    << got.Get(worst) << ", want " << want(worst) << ")";
}

TEST_P(CollectiveTest, AllReduce) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    for (size_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        TypedBuffer buf(dtype, count);
        for (size_t i = 0; i < count; ++i) buf.Set(i, TestValue(comm.rank(), i));
        ASSERT_TRUE(comm.AllReduce(buf.data(), count, dtype, op).ok());
        ExpectClose(
            buf, count, dtype, [&](size_t i) { return Reference(op, world, i, TestValue); },
            absl::StrCat("rank ", comm.rank(), " count ", count, " ", ReduceOpName(op)));
      }
    }
  });
}

TEST_P(CollectiveTest, Broadcast) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    for (size_t count : kCounts) {
      const int root = static_cast<int>(count % world);
      TypedBuffer buf(dtype, count);
      for (size_t i = 0; i < count; ++i) buf.Set(i, TestValue(comm.rank(), i));
      ASSERT_TRUE(comm.Broadcast(buf.data(), count, dtype, root).ok());
      ExpectClose(
          buf, count, dtype, [&](size_t i) { return TestValue(root, i); },
          absl::StrCat("rank ", comm.rank(), " count ", count));
    }
  });
}

TEST_P(CollectiveTest, Reduce) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    for (size_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        const int root = static_cast<int>((count + 1) % world);
        TypedBuffer buf(dtype, count);
        for (size_t i = 0; i < count; ++i) buf.Set(i, TestValue(comm.rank(), i));
        ASSERT_TRUE(comm.Reduce(buf.data(), count, dtype, op, root).ok());
        if (comm.rank() != root) continue;
        ExpectClose(
            buf, count, dtype, [&](size_t i) { return Reference(op, world, i, TestValue); },
            absl::StrCat("root ", root, " count ", count, " ", ReduceOpName(op)));
      }
    }
  });
}

TEST_P(CollectiveTest, AllGather) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    for (size_t count : kCounts) {
      TypedBuffer in(dtype, count), out(dtype, count * world);
      for (size_t i = 0; i < count; ++i) in.Set(i, TestValue(comm.rank(), i));
      ASSERT_TRUE(comm.AllGather(in.data(), out.data(), count, dtype).ok());
      ExpectClose(
          out, count * world, dtype,
          [&](size_t j) { return TestValue(static_cast<int>(j / count), j % count); },
          absl::StrCat("rank ", comm.rank(), " count ", count));
    }
  });
}

TEST_P(CollectiveTest, ReduceScatter) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    for (size_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        TypedBuffer in(dtype, count * world), out(dtype, count);
        for (size_t j = 0; j < count * world; ++j) {
          in.Set(j, TestValue(comm.rank(), j));
        }
        ASSERT_TRUE(comm.ReduceScatter(in.data(), out.data(), count, dtype, op).ok());
        const size_t base = static_cast<size_t>(comm.rank()) * count;
        ExpectClose(
            out, count, dtype, [&](size_t i) { return Reference(op, world, base + i, TestValue); },
            absl::StrCat("rank ", comm.rank(), " count ", count, " ", ReduceOpName(op)));
      }
    }
  });
}

TEST_P(CollectiveTest, SendRecv) {
  const auto [world, dtype] = GetParam();
  if (world < 2) GTEST_SKIP() << "point-to-point needs two ranks";
  RunRanks(world, [&](Communicator& comm) {
    const int right = (comm.rank() + 1) % world;
    const int left = (comm.rank() + world - 1) % world;
    for (size_t count : kCounts) {
      // Ring exchange with SendRecv (a plain Send-then-Recv would deadlock).
      TypedBuffer send(dtype, count), recv(dtype, count);
      for (size_t i = 0; i < count; ++i) send.Set(i, TestValue(comm.rank(), i));
      ASSERT_TRUE(comm.SendRecv(send.data(), count, right, recv.data(), count, left, dtype).ok());
      ExpectClose(
          recv, count, dtype, [&](size_t i) { return TestValue(left, i); },
          absl::StrCat("ring rank ", comm.rank(), " count ", count));
      // Rank 0 sends to everyone with plain Send / Recv and two tags.
      for (uint32_t tag : {7u, 9u}) {
        if (comm.rank() == 0) {
          for (int r = 1; r < world; ++r) {
            TypedBuffer b(dtype, count);
            for (size_t i = 0; i < count; ++i) b.Set(i, TestValue(r + tag, i));
            ASSERT_TRUE(comm.Send(b.data(), count, dtype, r, tag).ok());
          }
        } else {
          TypedBuffer b(dtype, count);
          ASSERT_TRUE(comm.Recv(b.data(), count, dtype, 0, tag).ok());
          ExpectClose(
              b, count, dtype, [&](size_t i) { return TestValue(comm.rank() + tag, i); },
              absl::StrCat("p2p rank ", comm.rank(), " tag ", tag));
        }
      }
    }
  });
}

// Each rank sends rank p (r + p) % 3 elements (some blocks empty), then a
// round in which rank 0 receives nothing at all (an expert rank no token
// is routed to): every block arrives where its counts say.
TEST_P(CollectiveTest, AllToAllV) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    const int r = comm.rank();
    for (int round = 0; round < 2; ++round) {
      auto n = [&](int from, int to) -> size_t {
        return round == 1 && to == 0 ? 0 : static_cast<size_t>((from + to) % 3 + round);
      };
      std::vector<size_t> send_counts(world), recv_counts(world);
      size_t sent = 0, received = 0;
      for (int p = 0; p < world; ++p) {
        send_counts[p] = n(r, p);
        recv_counts[p] = n(p, r);
        sent += send_counts[p];
        received += recv_counts[p];
      }
      // Element i of the block from `from` to `to`: a value naming both.
      auto value = [](int from, int to, size_t i) { return float(100 * from + 10 * to + i); };
      TypedBuffer send(dtype, sent), recv(dtype, received);
      size_t at = 0;
      for (int p = 0; p < world; ++p) {
        for (size_t i = 0; i < send_counts[p]; ++i) send.Set(at++, value(r, p, i));
      }
      ASSERT_TRUE(comm.AllToAllV(send.data(), send_counts, recv.data(), recv_counts, dtype).ok());
      std::vector<float> want;
      for (int p = 0; p < world; ++p) {
        for (size_t i = 0; i < recv_counts[p]; ++i) want.push_back(value(p, r, i));
      }
      ExpectClose(
          recv, received, dtype, [&](size_t i) { return want[i]; },
          absl::StrCat("rank ", r, " round ", round));
    }
    // Counts that do not match the group are refused before anything moves.
    std::vector<float> x(4);
    EXPECT_TRUE(absl::IsInvalidArgument(comm.AllToAllV(
        x.data(), {1}, x.data() + 2, std::vector<size_t>(world + 1, 0), DataType::kFloat32)));
  });
}

// Async ops complete in FIFO order; Wait returns each op's status; the flight
// recorder holds them as done.
TEST_P(CollectiveTest, AsyncAndFlightRecorder) {
  const auto [world, dtype] = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    constexpr int kOps = 6;
    std::vector<TypedBuffer> bufs;
    for (int k = 0; k < kOps; ++k) {
      bufs.emplace_back(dtype, 1000 + k);
      for (size_t i = 0; i < bufs[k].count(); ++i) {
        bufs[k].Set(i, TestValue(comm.rank() + k, i));
      }
    }
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      works.push_back(comm.AllReduceAsync(bufs[k].data(), bufs[k].count(), dtype, ReduceOp::kSum));
    }
    works.push_back(comm.BarrierAsync());
    for (auto& w : works) ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok());
    for (int k = 0; k < kOps; ++k) {
      ExpectClose(
          bufs[k], bufs[k].count(), dtype,
          [&](size_t i) {
            return Reference(ReduceOp::kSum, world, i,
                             [&](int r, size_t j) { return TestValue(r + k, j); });
          },
          absl::StrCat("async op ", k));
      EXPECT_EQ(works[k]->seq(), static_cast<uint64_t>(k + 1));
    }
    std::vector<FlightRecord> records = comm.flight_recorder().Dump();
    ASSERT_EQ(records.size(), static_cast<size_t>(kOps + 1));
    for (int k = 0; k < kOps; ++k) {
      EXPECT_EQ(records[k].seq, static_cast<uint64_t>(k + 1));
      EXPECT_EQ(records[k].op, OpType::kAllReduce);
      EXPECT_EQ(records[k].state, OpState::kDone);
      EXPECT_EQ(records[k].bytes, (1000 + k) * DataTypeSize(dtype));
      EXPECT_LE(records[k].start_time, records[k].end_time);
    }
    EXPECT_EQ(records[kOps].op, OpType::kBarrier);
  });
}

std::vector<Param> AllParams() {
  std::vector<Param> params;
  for (int world : {1, 2, 3, 4, 8}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
      params.push_back({world, dtype});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Gloo, CollectiveTest, ::testing::ValuesIn(AllParams()), ParamName);

// Counts large enough that every ring step is split into several 1 MiB
// segments in flight at once.
TEST(GlooLargeTest, MultiSegmentAllReduceAndReduceScatter) {
  for (int world : {2, 3}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16}) {
      RunRanks(world, [&](Communicator& comm) {
        const size_t count = 900001;  // > 3 segments per block at world 2
        TypedBuffer buf(dtype, count);
        for (size_t i = 0; i < count; ++i) buf.Set(i, TestValue(comm.rank(), i));
        ASSERT_TRUE(comm.AllReduce(buf.data(), count, dtype, ReduceOp::kSum).ok());
        ExpectClose(
            buf, count, dtype,
            [&](size_t i) { return Reference(ReduceOp::kSum, world, i, TestValue); },
            absl::StrCat("allreduce world ", world));
        const size_t per_rank = 600007;
        TypedBuffer in(dtype, per_rank * world), out(dtype, per_rank);
        for (size_t j = 0; j < per_rank * world; ++j) {
          in.Set(j, TestValue(comm.rank(), j));
        }
        ASSERT_TRUE(
            comm.ReduceScatter(in.data(), out.data(), per_rank, dtype, ReduceOp::kMax).ok());
        const size_t base = static_cast<size_t>(comm.rank()) * per_rank;
        ExpectClose(
            out, per_rank, dtype,
            [&](size_t i) { return Reference(ReduceOp::kMax, world, base + i, TestValue); },
            absl::StrCat("reduce-scatter world ", world));
      });
    }
  }
}

// A 2x2 mesh: rank = row * 2 + col. Row groups and column groups are
// sub-communicators with their own contexts; each all-reduces correctly.
TEST(GlooSubGroupTest, MeshRowsAndColumns) {
  RunRanks(4, [](Communicator& world) {
    const int row = world.rank() / 2, col = world.rank() % 2;
    auto row_comm = world.Split(/*color=*/row, /*key=*/col);
    ASSERT_TRUE(row_comm.ok()) << row_comm.status();
    auto col_comm = world.Split(/*color=*/col, /*key=*/row);
    ASSERT_TRUE(col_comm.ok()) << col_comm.status();
    ASSERT_EQ((*row_comm)->size(), 2);
    ASSERT_EQ((*row_comm)->rank(), col);
    ASSERT_EQ((*col_comm)->size(), 2);
    ASSERT_EQ((*col_comm)->rank(), row);
    EXPECT_NE((*row_comm)->group_name(), (*col_comm)->group_name());

    const size_t n = 1001;
    std::vector<float> r(n), c(n);
    for (size_t i = 0; i < n; ++i) r[i] = c[i] = TestValue(world.rank(), i);
    // Interleave async ops on both groups; each runs on its own thread.
    auto wr = (*row_comm)->AllReduceAsync(r.data(), n, DataType::kFloat32, ReduceOp::kSum);
    auto wc = (*col_comm)->AllReduceAsync(c.data(), n, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(wr->Wait().ok());
    ASSERT_TRUE(wc->Wait().ok());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(r[i], TestValue(row * 2, i) + TestValue(row * 2 + 1, i)) << i;
      ASSERT_EQ(c[i], TestValue(col, i) + TestValue(2 + col, i)) << i;
    }
    // A world all-reduce still works after the splits.
    std::vector<float> w(n);
    for (size_t i = 0; i < n; ++i) w[i] = TestValue(world.rank(), i);
    ASSERT_TRUE(world.AllReduce(w.data(), n, DataType::kFloat32, ReduceOp::kMax).ok());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(w[i], Reference(ReduceOp::kMax, 4, i, TestValue));
    }
    // NewGroup of the diagonal {3, 0}: rank 3 becomes rank 0 there.
    auto diag = world.NewGroup({3, 0});
    ASSERT_TRUE(diag.ok()) << diag.status();
    if (world.rank() == 1 || world.rank() == 2) {
      EXPECT_EQ(*diag, nullptr);
    } else {
      ASSERT_NE(*diag, nullptr);
      EXPECT_EQ((*diag)->rank(), world.rank() == 3 ? 0 : 1);
      float x = static_cast<float>(world.rank());
      ASSERT_TRUE((*diag)->AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum).ok());
      EXPECT_EQ(x, 3.0f);
    }
    EXPECT_TRUE((*row_comm)->Shutdown().ok());
    EXPECT_TRUE((*col_comm)->Shutdown().ok());
  });
}

// Rank 2 does not enter the collective: the others fail with
// DEADLINE_EXCEEDED within timeout + 2 s, naming op, seq, group and rank 2;
// the communicator is poisoned afterwards.
TEST(GlooFailureTest, TimeoutNamesMissingRank) {
  GlooOptions options;
  options.timeout = absl::Seconds(1);
  options.dump_on_failure = false;
  absl::Notification others_failed;
  std::atomic<int> failed{0};
  RunRanks(
      3,
      [&](Communicator& comm) {
        std::vector<float> x(100, 1.0f);
        ASSERT_TRUE(comm.Barrier().ok());  // seq 1, everyone
        if (comm.rank() == 2) {
          others_failed.WaitForNotification();
          // Peers closed their connections: this rank fails fast too.
          const absl::Time t0 = absl::Now();
          absl::Status s = comm.AllReduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
          EXPECT_FALSE(s.ok());
          EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
          return;
        }
        const absl::Time t0 = absl::Now();
        absl::Status s = comm.AllReduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
        const absl::Duration took = absl::Now() - t0;
        EXPECT_LT(took, absl::Seconds(1 + 2)) << s;
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_NE(s.message().find("AllReduce seq=2"), std::string::npos) << s;
        EXPECT_NE(s.message().find("ranks not arrived (dead, hung or behind): [2]"),
                  std::string::npos)
            << s;
        EXPECT_NE(s.message().find("GlooFailureTest/TimeoutNamesMissingRank/world"),
                  std::string::npos)
            << s;
        // Poisoned: later calls fail at once.
        const absl::Time t1 = absl::Now();
        absl::Status later = comm.Barrier();
        EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
        EXPECT_LT(absl::Now() - t1, absl::Milliseconds(100));
        std::vector<FlightRecord> records = comm.flight_recorder().Dump();
        ASSERT_FALSE(records.empty());
        EXPECT_EQ(records.back().state, OpState::kFailed);
        if (++failed == 2) others_failed.Notify();
      },
      options);
}

// An all-to-all waiting for a rank that never joins it fails by the
// communicator's timeout, naming the op.
TEST(GlooFailureTest, AllToAllVTimesOutOnAMissingRank) {
  GlooOptions options;
  options.timeout = absl::Seconds(1);
  options.dump_on_failure = false;
  absl::Notification done;
  RunRanks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) {
          done.WaitForNotification();
          return;
        }
        std::vector<float> in(2, 1.0f), out(2);
        const absl::Time t0 = absl::Now();
        absl::Status s = comm.AllToAllV(in.data(), {1, 1}, out.data(), {1, 1}, DataType::kFloat32);
        EXPECT_FALSE(s.ok());
        EXPECT_LT(absl::Now() - t0, absl::Seconds(4)) << s;
        EXPECT_NE(s.message().find("AllToAllV"), std::string::npos) << s;
        done.Notify();
      },
      options);
}

// A write to a dead peer must fail the op, not kill the process.
TEST(GlooFailureTest, SigpipeIsIgnoredOnceACommunicatorExists) {
  RunRanks(2, [](Communicator&) {});
  struct sigaction act {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &act), 0);
  EXPECT_EQ(act.sa_handler, SIG_IGN);
}

// A peer that never joins: creation fails with DEADLINE_EXCEEDED after the
// timeout instead of hanging (FileStore's own 30 s default is not used).
TEST(GlooFailureTest, RendezvousTimesOutWhenPeerMissing) {
  auto store = std::make_shared<InMemoryStore>();
  GlooOptions options;
  options.prefix = "rendezvous_timeout";
  options.timeout = absl::Milliseconds(500);
  const absl::Time t0 = absl::Now();
  auto comm = CreateGlooCommunicator(store, 0, 2, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500) + absl::Seconds(2));
}

// Bad arguments are reported without poisoning; Work::Wait with a short
// timeout reports "still running" and the op completes afterwards.
TEST(GlooAsyncTest, WaitTimeoutAndInvalidArguments) {
  RunRanks(2, [](Communicator& comm) {
    float x = 1.0f;
    absl::Status bad = comm.Send(&x, 1, DataType::kFloat32, comm.rank());
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    bad = comm.Broadcast(&x, 1, DataType::kFloat32, 5);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(comm.health().ok());

    std::vector<float> v(1000, 1.0f);
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto work = comm.AllReduceAsync(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    if (comm.rank() == 0) {
      absl::Status early = work->Wait(absl::Milliseconds(10));
      EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
      EXPECT_NE(early.message().find("still running"), std::string::npos);
      EXPECT_FALSE(work->Done());
    }
    ASSERT_TRUE(work->Wait(absl::Seconds(10)).ok());
    EXPECT_TRUE(work->Done());
    EXPECT_EQ(v[0], 2.0f);
  });
}

// A failure in one sub-group aborts ranks blocked in another sub-group that
// does not contain the failed rank (through the world's failure counter,
// GlooOptions::failure_domains), long before their own op's timeout: what a
// tp/pp/dp mesh needs when one rank dies.
TEST(GlooSubGroupTest, FailureInOneSubGroupAbortsTheOthers) {
  GlooOptions options;
  options.timeout = absl::Seconds(30);
  RunRanks(
      4,
      [](Communicator& world) {
        const int row = world.rank() / 2;
        auto group = world.Split(/*color=*/row, /*key=*/world.rank() % 2);
        ASSERT_TRUE(group.ok()) << group.status();
        float x = 1.0f;
        const absl::Time start = absl::Now();
        if (world.rank() == 0) {
          // Rank 1 never sends: this Recv times out after 300 ms.
          OpArgs a;
          a.type = OpType::kRecv;
          a.output = &x;
          a.count = 1;
          a.peer = 1;
          a.timeout = absl::Milliseconds(300);
          EXPECT_TRUE(absl::IsDeadlineExceeded((*group)->Submit(a)->Wait()));
        } else if (world.rank() == 2) {
          // Rank 3 never joins: only the other row's failure can end this.
          absl::Status s = (*group)->AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
          const absl::Duration took = absl::Now() - start;
          EXPECT_TRUE(absl::IsAborted(s)) << s;
          EXPECT_NE(s.message().find("enclosing group"), std::string::npos) << s;
          EXPECT_LT(took, absl::Seconds(10)) << "aborted only after " << took;
        }
      },
      options);
}

}  // namespace
}  // namespace shardtrain::comm
