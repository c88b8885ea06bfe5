#include "worker/comm/flight_recorder.h"

#include "gtest/gtest.h"

namespace shardtrain::comm {
namespace {

FlightRecord Rec(uint64_t seq) {
  FlightRecord r;
  r.seq = seq;
  r.op = OpType::kAllReduce;
  r.group = "world";
  r.bytes = 4 * seq;
  r.enqueue_time = absl::Now();
  return r;
}

TEST(FlightRecorderTest, KeepsLastNOldestFirst) {
  FlightRecorder fr(3);
  for (uint64_t s = 1; s <= 5; ++s) fr.Queued(Rec(s));
  fr.Running(4);
  fr.Done(4);
  fr.Running(5);
  fr.Failed(5, "boom: ranks not arrived [2]");
  fr.Done(1);  // evicted: ignored
  std::vector<FlightRecord> d = fr.Dump();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].seq, 3u);
  EXPECT_EQ(d[0].state, OpState::kQueued);
  EXPECT_EQ(d[1].seq, 4u);
  EXPECT_EQ(d[1].state, OpState::kDone);
  EXPECT_EQ(d[2].seq, 5u);
  EXPECT_EQ(d[2].state, OpState::kFailed);
  EXPECT_EQ(d[2].error, "boom: ranks not arrived [2]");
  const std::string text = fr.DumpText();
  EXPECT_NE(text.find("seq=5 AllReduce group=world bytes=20 fp32 peer=-1 state=failed"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("seq=3 AllReduce"), std::string::npos) << text;
  EXPECT_EQ(text.find("seq=2 "), std::string::npos) << text;
}

}  // namespace
}  // namespace shardtrain::comm
