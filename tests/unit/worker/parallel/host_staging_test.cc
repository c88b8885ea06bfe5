// Data parallelism through host copies — the path GPU ranks take when they
// share one GPU and all-reduce with Gloo — against the plain host path, on
// 3 thread ranks with Gloo (unit sizes leave remainders over 3, so the tail
// ops run too):
//   DDP      each bucket copied out once final, all-reduced on the host
//            while backward goes on, the sums copied back;
//   DDP with parallel.offload: optimizer — also AdamW on the host over a host
//            copy of the master, the parameters copied back after the step;
//   ZeRO-k   host mirrors of the engine's buffers: each unit's gradient
//            copied out when final and reduced there, gathered units (3) or
//            the gathered parameters after a step (1-2) copied in.
//   DDP and ZeRO-1/2 over a device-memory communicator (NCCL's path,
//            played by Gloo behind a wrapper that takes device addresses):
//            each bucket or unit reduced in the engine's memory, ordered
//            after the backward by an event, never copied to the host; the
//            shard stepped and all-gathered there;
//   pipeline 2 stages of the same GPT on 2 ranks, 1F1B over 4 micro-batches:
//            staged, each stage's output and input gradient copied to the
//            host before they are sent, what arrives copied into the
//            engine's memory; over device-memory communicators, sent and
//            received in the engine's memory, each transfer after an event;
//            DDP and ZeRO-1 summing a stage's tied embeddings and tp
//            partials where those groups take them (through a copy when
//            elsewhere).
// The staged runs use an OffHostEngine, whose buffers say they are a GPU's:
// any host view of them aborts as on a real GPU rank. Losses (training and
// evaluation), the parameters after 3 steps of 2 micro-batches, and every
// rank's checkpoint shard (params, m, v) equal the plain path bit for bit
// (the same collectives on the same values), through a Restore midway (ZeRO).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/slice.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "tests/unit/worker/parallel/device_memory_comm.h"
#include "tests/unit/worker/parallel/off_host_engine.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/parallel/ddp.h"
#include "worker/parallel/pipeline.h"
#include "worker/parallel/zero.h"

namespace shardtrain::parallel {
namespace {

constexpr int kRanks = 3, kB = 2, kT = 8, kAccum = 2, kSteps = 3, kVocab = 50;

struct RankResult {
  std::vector<double> losses;  // per micro-batch, then the evaluation's sum
  std::vector<float> params;   // the whole model after the last step
  std::vector<float> shard;    // SaveParams, SaveM, SaveV after the last step
  bool optimizer_on_host = false;
};

constexpr int kDdpOffload = 4;  // the cases: ZeRO stage 0 (DDP) to 3, then this
constexpr int kDdpBf16 = 5;     // and DDP reducing in bf16 (device-memory communicators)

absl::StatusOr<std::unique_ptr<DataParallel>> Strategy(int zero, bool staged, engine::Engine* e,
                                                       comm::Communicator* comm) {
  if (zero == 0 || zero == kDdpOffload || zero == kDdpBf16) {
    auto ddp = Ddp::Create(e, optim::AdamWOptions(), comm, /*bucket_bytes=*/4096, staged,
                           /*offload_optimizer=*/zero == kDdpOffload,
                           /*reduce_bf16=*/zero == kDdpBf16);
    if (!ddp.ok()) return ddp.status();
    return std::unique_ptr<DataParallel>(*std::move(ddp));
  }
  ZeroOptions o;
  o.stage = zero;
  o.stage_through_host = staged;
  auto z = Zero::Create(o, e, optim::AdamWOptions(), comm);
  if (!z.ok()) return z.status();
  return std::unique_ptr<DataParallel>(*std::move(z));
}

// The engine a run drives — `gpt` itself, or (off_host) the OffHostEngine
// around it — and the plain CPU engine underneath, for reading results.
struct Driven {
  std::unique_ptr<engine::Engine> engine;
  engine::Engine* host = nullptr;
};
Driven Drive(std::unique_ptr<engine::cpu::CpuModel> gpt, bool off_host) {
  Driven d;
  d.host = gpt.get();
  if (off_host) {
    d.engine = std::make_unique<testing::OffHostEngine>(std::move(gpt));
  } else {
    d.engine = std::move(gpt);
  }
  return d;
}

void Tokens(int step, int micro, int rank, std::vector<int>* in, std::vector<int>* tgt) {
  for (int i = 0; i < kB * kT; ++i) {
    (*in)[i] = (step * 31 + micro * 7 + rank * 13 + i * 5) % kVocab;
    (*tgt)[i] = ((*in)[i] * 3 + 1) % kVocab;
  }
}

void RankRun(comm::Communicator& comm, int zero, bool off_host, RankResult* out) {
  // L=2, NH=2, C=10, vocab 50: units of 730, 1330, 1330 and 20 elements.
  auto config = model::MakeGptConfig(2, 2, 10, kT, kVocab);
  ASSERT_TRUE(config.ok());
  auto gpt = engine::cpu::CpuModel::Create(*config, kB, kT, 1);
  ASSERT_TRUE(gpt.ok());
  Driven d = Drive(*std::move(gpt), off_host);
  engine::Engine *e = d.engine.get(), *host = d.host;
  // A device-memory communicator needs no host staging (NCCL's way).
  auto dp = Strategy(zero, off_host && !comm.device_memory(), e, &comm);
  ASSERT_TRUE(dp.ok()) << dp.status();
  DataParallel& s = **dp;
  s.InitParams(5);
  std::vector<int> in(kB * kT), tgt(kB * kT);
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      Tokens(step, micro, comm.rank(), &in, &tgt);
      s.BeginMicroBatch(micro, kAccum);
      out->losses.push_back(e->Forward(in.data(), tgt.data()));
      e->Backward(1.0f / kAccum);
      ASSERT_TRUE(s.EndMicroBatch().ok());
    }
    auto stats = s.Step(1e-2f, 1.0f);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_FALSE(stats->skipped);
    // A checkpoint's shard back into the strategy, midway (where a rank
    // reads what it writes: ZeRO; DDP writes a split and reads the whole).
    if (step == 1 && s.LoadRanges() == s.SaveRanges()) {
      auto restored = s.Restore(s.SaveParams(), s.SaveM(), s.SaveV(), s.optimizer_step());
      ASSERT_TRUE(restored.ok()) << restored;
    }
  }
  s.BeginEval();
  Tokens(kSteps, 0, comm.rank(), &in, &tgt);
  auto eval = s.EndEval(e->Forward(in.data(), tgt.data()));
  ASSERT_TRUE(eval.ok()) << eval.status();
  out->losses.push_back(*eval);
  for (const auto& part : {s.SaveParams(), s.SaveM(), s.SaveV()}) {
    out->shard.insert(out->shard.end(), part.begin(), part.end());
  }
  ASSERT_TRUE(s.GatherWholeModel().ok());
  out->params.assign(host->params().f32().begin(), host->params().f32().end());
  out->optimizer_on_host = s.memory().optimizer_on_host;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class HostStagingTest : public ::testing::TestWithParam<int> {};

// `ranks` thread ranks run case `zero` on plain host engines and again on
// OffHostEngines; every rank's losses, model and shard must be bit-equal.
void ExpectStagedEqualsPlain(int ranks, int zero) {
  std::vector<RankResult> plain(ranks), staged(ranks);
  comm::testing::RunRanks(
      ranks, [&](comm::Communicator& c) { RankRun(c, zero, false, &plain[c.rank()]); });
  comm::testing::RunRanks(
      ranks, [&](comm::Communicator& c) { RankRun(c, zero, true, &staged[c.rank()]); });
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(plain[r].losses.size(), size_t{kSteps * kAccum + 1});
    EXPECT_EQ(staged[r].losses, plain[r].losses);
    EXPECT_TRUE(BitEqual(staged[r].params, plain[r].params));
    EXPECT_TRUE(BitEqual(staged[r].shard, plain[r].shard));
    EXPECT_EQ(staged[r].params, plain[0].params);  // every rank holds the same model
    if (zero > 0) {
      EXPECT_TRUE(staged[r].optimizer_on_host);
    } else {
      EXPECT_FALSE(staged[r].optimizer_on_host);
    }
  }
  std::printf(
      "[host-staging] %d rank(s), case %d: %zu losses, %zu parameters, %zu shard values equal; "
      "last training loss %.7f\n",
      ranks, zero, staged[0].losses.size(), staged[0].params.size(), staged[0].shard.size(),
      staged[0].losses[kSteps * kAccum - 1]);
}

TEST_P(HostStagingTest, OffHostBuffersThroughTheHostEqualThePlainPathBitForBit) {
  ExpectStagedEqualsPlain(kRanks, GetParam());
}

// One rank with the optimizer offloaded: no all-reduce brings the gradients
// to the host, so they are summed, measured and clipped in the engine's
// memory and copied out for the host's AdamW.
TEST(HostStagingTest, OneRankWithTheOptimizerOffloadedEqualsThePlainPathBitForBit) {
  ExpectStagedEqualsPlain(1, kDdpOffload);
}

using testing::DeviceMemoryComm;

// DDP and ZeRO-1/2/3 on GPU ranks with NCCL, their logic on CPU: the buckets
// (units) all-reduced (ZeRO-2: reduce-scattered into a device shard,
// accumulated over micro-batches there) in place in the engine's (device)
// memory, the unit gradients released and acquired again around their use,
// the shard stepped and all-gathered in place, the norm and the evaluation's
// loss sum through a device scratch; DDP with the optimizer offloaded
// reduces on the device the same way, then copies the mean gradient out to
// the host's AdamW; equal to the plain host path bit for bit, checkpoint
// shards included.
TEST(HostStagingTest, DataParallelOverADeviceMemoryCommunicatorEqualsThePlainPathBitForBit) {
  for (int zero : {0, 1, 2, 3, kDdpOffload}) {
    SCOPED_TRACE(zero);
    std::vector<RankResult> plain(kRanks), device(kRanks);
    std::vector<int> ops(kRanks), host_ops(kRanks), unordered(kRanks);
    comm::testing::RunRanks(
        kRanks, [&](comm::Communicator& c) { RankRun(c, zero, false, &plain[c.rank()]); });
    comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
      DeviceMemoryComm d(c);
      RankRun(d, zero, true, &device[c.rank()]);
      ops[c.rank()] = d.ops();
      host_ops[c.rank()] = d.host_ops();
      unordered[c.rank()] = d.unordered();
    });
    for (int r = 0; r < kRanks; ++r) {
      SCOPED_TRACE(r);
      EXPECT_EQ(device[r].losses, plain[r].losses);
      EXPECT_TRUE(BitEqual(device[r].params, plain[r].params));
      EXPECT_TRUE(BitEqual(device[r].shard, plain[r].shard));
      EXPECT_EQ(device[r].optimizer_on_host, zero == kDdpOffload);
      EXPECT_GT(ops[r], kSteps);  // reductions each step, and the evaluation
      EXPECT_EQ(host_ops[r], 0) << "ops on host memory";
      EXPECT_EQ(unordered[r], 0) << "reductions not ordered after the device's work";
    }
    std::printf(
        "[host-staging] %s over a device-memory communicator, %d ranks: %d ops, none on host "
        "memory, every reduction after an event; %zu parameters, %zu shard values equal\n",
        zero == 0             ? "DDP"
        : zero == kDdpOffload ? "DDP, optimizer offloaded,"
                              : absl::StrCat("ZeRO-", zero).c_str(),
        kRanks, ops[0], device[0].params.size(), device[0].shard.size());
  }
}

// DDP reducing in bf16 (parallel.reduce_dtype), NCCL's way: each bucket
// converted to bf16 in the engine's memory and all-reduced as bf16 (the ops
// say so), the sum converted back into the fp32 gradient. Not bit-equal to
// the fp32 reduction (it rounds), but within bf16's precision of it over
// the steps; half the bytes counted.
TEST(HostStagingTest, DdpReducingInBf16StaysWithinBf16PrecisionOfFp32) {
  std::vector<RankResult> fp32(kRanks), bf16(kRanks);
  std::vector<int> ops(kRanks), bf16_ops(kRanks), host_ops(kRanks);
  comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
    DeviceMemoryComm d(c);
    RankRun(d, 0, true, &fp32[c.rank()]);
  });
  comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
    DeviceMemoryComm d(c);
    RankRun(d, kDdpBf16, true, &bf16[c.rank()]);
    ops[c.rank()] = d.ops();
    bf16_ops[c.rank()] = d.bf16_ops();
    host_ops[c.rank()] = d.host_ops();
  });
  // AdamW's update is sign-like: where a summed gradient nearly cancels,
  // bf16's rounding can flip it and move that parameter by up to lr a step;
  // the typical parameter moves far less, and the loss barely.
  double worst_loss = 0, mean_param = 0;
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(bf16[r].losses.size(), fp32[r].losses.size());
    for (size_t i = 0; i < fp32[r].losses.size(); ++i) {
      worst_loss = std::max(worst_loss, std::abs(bf16[r].losses[i] - fp32[r].losses[i]) /
                                            std::abs(fp32[r].losses[i]));
    }
    ASSERT_EQ(bf16[r].params.size(), fp32[r].params.size());
    double sum = 0;
    for (size_t i = 0; i < fp32[r].params.size(); ++i) {
      sum += std::abs(bf16[r].params[i] - fp32[r].params[i]);
    }
    mean_param = std::max(mean_param, sum / double(fp32[r].params.size()));
    EXPECT_FALSE(BitEqual(bf16[r].params, fp32[r].params)) << "the bf16 reduction changed nothing";
    EXPECT_EQ(bf16[r].params, bf16[0].params);  // every rank the same model
    EXPECT_GT(bf16_ops[r], 0);
    EXPECT_EQ(host_ops[r], 0);
  }
  EXPECT_LT(worst_loss, 2e-3);
  EXPECT_LT(mean_param, 1e-3);
  std::printf(
      "[host-staging] DDP reducing in bf16, %d ranks: %d of %d ops in bf16; losses within %.2g "
      "(relative), parameters %.2g apart on average from the fp32 reduction after %d steps\n",
      kRanks, bf16_ops[0], ops[0], worst_loss, mean_param, kSteps);
}

INSTANTIATE_TEST_SUITE_P(DdpAndZero, HostStagingTest, ::testing::Values(0, 1, 2, 3, kDdpOffload),
                         [](const ::testing::TestParamInfo<int>& p) {
                           if (p.param == 0) return std::string("Ddp");
                           if (p.param == kDdpOffload) return std::string("DdpOffloadOptimizer");
                           return "Zero" + std::to_string(p.param);
                         });

// One pipeline stage per rank (2 ranks) of the GPT above, 1F1B over
// kMicros micro-batches for kSteps steps under DDP or ZeRO-1 (dp 1), the
// strategy bracketing each backward as the trainer does. Stand-ins for the
// model-parallel sums: the tied embeddings' sum doubles them, the tp
// partials' (the LayerNorms' ranges) triples them — in host memory, or in
// the engine's when the run's groups are of device memory. The summed
// losses per step, and the stage's parameters after the last step.
constexpr int kMicros = 4;

enum class Exchange { kPlain, kStaged, kDevice };

struct StageCounts {
  int ops = 0, host_ops = 0, unordered = 0;  // device mode: the pipeline's
};

void StageRun(comm::Communicator& world, Exchange how, int zero, RankResult* out,
              StageCounts* counts = nullptr) {
  auto config = model::MakeGptConfig(2, 2, 10, kT, kVocab);
  ASSERT_TRUE(config.ok());
  auto layers = model::StageLayers(*config, 2, {});
  ASSERT_TRUE(layers.ok());
  engine::ModelEngineOptions options;
  options.slice = model::SliceOf(*layers, world.rank(), 1, 0);
  options.slots = 2;  // 1F1B on 2 stages keeps at most 2 micro-batches
  auto gpt = engine::cpu::CpuModel::Create(*config, kB, kT, 1, options);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const bool device = how == Exchange::kDevice;
  Driven d = Drive(*std::move(gpt), how != Exchange::kPlain);
  engine::Engine *e = d.engine.get(), *host = d.host;
  std::unique_ptr<DeviceMemoryComm> device_world;
  comm::Communicator* comm = &world;
  if (device) {
    device_world = std::make_unique<DeviceMemoryComm>(world);
    comm = device_world.get();
  }
  // Two stages: the world is their one neighbour pair.
  const bool first = comm->rank() == 0;
  auto pipe = PipelineExecutor::Create(e, first ? nullptr : comm, first ? comm : nullptr,
                                       comm->rank(), 2, PipelineSchedule::k1F1B, kMicros);
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  auto strategy = Strategy(zero, how == Exchange::kStaged, e, nullptr);
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  DataParallel& s = **strategy;
  ModelParallelGrads mp;
  mp.device_memory = device;
  auto times = [e, device](float k) {
    return [e, device, k](absl::Span<float> g) {
      if (device) {
        e->math().Scale(g.data(), g.size(), k);  // reads device addresses only
      } else {
        for (float& x : g) x *= k;
      }
      return absl::OkStatus();
    };
  };
  mp.tied_end = e->layout().units()[0].numel;
  mp.sum_tied = times(2.0f);
  mp.tp_partial = e->layout().TpPartialRanges(/*sequence_parallel=*/true);
  mp.sum_tp = times(3.0f);
  s.set_model_parallel(mp);
  s.InitParams(9);
  for (int step = 0; step < kSteps; ++step) {
    auto fill = [&](int micro, int* tokens, int* targets) {
      std::vector<int> in(kB * kT), tgt(kB * kT);
      Tokens(step, micro, 0, &in, &tgt);
      std::copy(in.begin(), in.end(), tokens);
      std::copy(tgt.begin(), tgt.end(), targets);
      return absl::OkStatus();
    };
    auto begin = [&](int m) {
      s.BeginMicroBatch(m, kMicros);
      return absl::OkStatus();
    };
    auto end = [&](int) { return s.EndMicroBatch(); };
    auto r = (*pipe)->RunStep(fill, begin, end, 1.0f / kMicros);
    ASSERT_TRUE(r.ok()) << r.status();
    out->losses.push_back(r->loss_sum);
    auto stats = s.Step(1e-2f, 1.0f);
    ASSERT_TRUE(stats.ok()) << stats.status();
  }
  ASSERT_TRUE(s.GatherWholeModel().ok());
  out->params.assign(host->params().f32().begin(), host->params().f32().end());
  if (counts != nullptr && device) {  // the world's and its split's
    counts->ops = device_world->ops();
    counts->host_ops = device_world->host_ops();
    counts->unordered = device_world->unordered();
  }
}

// The staged (Gloo through the host) and device-memory (NCCL's way) pipeline
// exchanges, with the tied and tp-partial sums where their groups take
// them, equal the plain host path bit for bit — under DDP, and under ZeRO-1
// with dp 1, whose host shard reaches a device-memory sum through a copy.
TEST(HostStagingTest, PipelineStagesAndModelParallelSumsOffTheHostEqualThePlainPathBitForBit) {
  for (int zero : {0, 1}) {
    SCOPED_TRACE(zero);
    std::vector<RankResult> plain(2), staged(2), device(2);
    std::vector<StageCounts> counts(2);
    comm::testing::RunRanks(
        2, [&](comm::Communicator& c) { StageRun(c, Exchange::kPlain, zero, &plain[c.rank()]); });
    comm::testing::RunRanks(
        2, [&](comm::Communicator& c) { StageRun(c, Exchange::kStaged, zero, &staged[c.rank()]); });
    comm::testing::RunRanks(2, [&](comm::Communicator& c) {
      StageRun(c, Exchange::kDevice, zero, &device[c.rank()], &counts[c.rank()]);
    });
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(r);
      ASSERT_EQ(plain[r].losses.size(), size_t{kSteps});
      EXPECT_EQ(staged[r].losses, plain[r].losses);
      EXPECT_TRUE(BitEqual(staged[r].params, plain[r].params));
      EXPECT_EQ(device[r].losses, plain[r].losses);
      EXPECT_TRUE(BitEqual(device[r].params, plain[r].params));
      // Each stage sends and receives once per micro-batch and direction it
      // has, and 1F1B's steady state groups kMicros - 1 of its sends with
      // the next receive (one SendRecv each): kMicros + 1 ops a step.
      EXPECT_EQ(counts[r].ops, (kMicros + 1) * kSteps);
      EXPECT_EQ(counts[r].host_ops, 0) << "transfers of host memory";
      EXPECT_EQ(counts[r].unordered, 0) << "transfers not ordered after the device's work";
    }
    EXPECT_GT(plain[1].losses.back(), 0.0);  // the last stage computes the loss
    std::printf(
        "[host-staging] pipeline 2 stages x %d micro-batches, %s, staged and device-memory "
        "exchanges: %zu + %zu parameters equal; %d transfers per stage, all of device memory "
        "after an event; last step's loss sum %.7f\n",
        kMicros, zero == 0 ? "DDP" : "ZeRO-1", staged[0].params.size(), staged[1].params.size(),
        counts[0].ops, staged[1].losses.back());
  }
}

}  // namespace
}  // namespace shardtrain::parallel
