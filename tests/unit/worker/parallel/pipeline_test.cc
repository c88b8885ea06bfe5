// PipelineExecutor (worker/parallel/pipeline.h) on thread ranks with Gloo
// over 127.0.0.1, each rank a stage of a fake model: stage s multiplies its
// (B, T, C) input by one weight w_s, the first stage embeds token ids as
// (id + c) / 8, and the last stage's loss is the mean of (y - target)² / 2.
// For pp 2 and 4, m 1, 4 and 8 and both schedules, with engines that keep
// just the slots the schedule needs, two steps' summed losses and every
// stage's accumulated gradient must equal — exactly, the same float
// operations in the same order — a sequential computation in one thread;
// interleaved 1F1B too (2 or 3 model chunks per stage, each a virtual stage
// of the sequential computation, over the mesh's one-way channels).
// Also: forward-only passes, the backward brackets, the step timeline, an
// engine with too few slots, and a stage whose neighbour never sends (also
// interleaved, around the ring), which must fail with the communicator's
// timeout instead of hanging.
#include "worker/parallel/pipeline.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/parallel/mesh.h"

namespace shardtrain::parallel {
namespace {

using comm::testing::RunRanks;

constexpr int kB = 2, kT = 3, kC = 3;
constexpr int kN = kB * kT * kC;  // activation elements per micro-batch

float Weight(int stage) { return 1.25f - 0.375f * static_cast<float>(stage); }

int Token(int step, int micro, int i) { return (step * 31 + micro * 7 + i * 5) % 11; }
int Target(int step, int micro, int i) { return (step * 13 + micro * 3 + i * 2) % 5; }

absl::Status Fill(int step, int micro, int* tokens, int* targets) {
  for (int i = 0; i < kB * kT; ++i) {
    tokens[i] = Token(step, micro, i);
    targets[i] = Target(step, micro, i);
  }
  return absl::OkStatus();
}

// The fake model's math, shared by the fake engine and the reference so that
// both run the same float operations.
void Embed(const int* tokens, float* x) {
  for (int i = 0; i < kB * kT; ++i) {
    for (int c = 0; c < kC; ++c) x[i * kC + c] = static_cast<float>(tokens[i] + c) / 8.0f;
  }
}
void Scale(float w, const float* x, float* y) {
  for (int k = 0; k < kN; ++k) y[k] = w * x[k];
}
// Mean over all elements of (y - target)² / 2; dy its gradient.
float Loss(const float* y, const int* targets, float* dy) {
  float sum = 0;
  for (int k = 0; k < kN; ++k) {
    const float d = y[k] - static_cast<float>(targets[k / kC]);
    sum += 0.5f * d * d;
    if (dy != nullptr) dy[k] = d / kN;
  }
  return sum / kN;
}
// Accumulates loss_scale · dL/dw into *dw; dx = w · dy (unscaled).
void ScaleBackward(float w, const float* x, const float* dy, float loss_scale, float* dw,
                   float* dx) {
  float g = 0;
  for (int k = 0; k < kN; ++k) g += dy[k] * x[k];
  *dw += loss_scale * g;
  if (dx != nullptr) {
    for (int k = 0; k < kN; ++k) dx[k] = w * dy[k];
  }
}

[[noreturn]] void Unused(const char* what) {
  std::fprintf(stderr, "FakeStage: %s is not used by the executor\n", what);
  std::abort();
}

// One pipeline stage of the fake model, of `chunks` model chunks (chunk c
// is virtual stage c·stages + stage, with that stage's weight; `slots` of
// each chunk, numbered chunk by chunk). Checks the slot contract: a forward
// goes into a free slot, a backward into the slot of its forward.
class FakeStage final : public engine::Engine {
 public:
  FakeStage(int stage, int stages, int slots, int chunks = 1)
      : config_(*model::MakeGptConfig(4, 1, kC, kT, 50)),
        layout_(config_),
        table_(config_, kB, kT),
        stage_(stage),
        stages_(stages),
        slots_(slots),
        chunks_(chunks),
        x_(slots * chunks, std::vector<float>(kN)),
        y_(slots * chunks, std::vector<float>(kN)),
        targets_(slots * chunks, std::vector<int>(kB * kT)),
        busy_(slots * chunks, false),
        dx_(kN) {
    for (int c = 0; c < chunks; ++c) w_.push_back(Weight(c * stages + stage));
    chunk_dw.assign(chunks, 0.0f);
  }

  const model::ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return kB; }
  int max_seq_len() const override { return kT; }
  engine::Device& device() override { Unused("device"); }
  engine::Buffer& param_buffer() override { Unused("param_buffer"); }
  engine::Buffer& grad_buffer() override { Unused("grad_buffer"); }
  const model::ActivationTable& activations() const override { return table_; }
  int64_t activation_bytes() const override { return 0; }
  int64_t ResidentActivationBytes() const override { return 0; }
  engine::ThreadPool* host_pool() override { return nullptr; }
  engine::FlatMath& math() override { return math_; }
  void InitParamsInto(uint64_t, size_t, size_t, float*) override {}
  float Forward(const int*, const int*, int, int) override { Unused("Forward"); }
  void Backward(float) override { Unused("Backward"); }
  void ZeroGrad() override { chunk_dw.assign(chunks_, 0.0f); }
  void ReadLogits(int, float*) const override {}
  void set_grads_ready_hook(std::function<void(size_t)>) override {}
  void set_param_hook(std::function<void(int, bool)>) override {}

  int slots() const override { return slots_ * chunks_; }
  int chunks() const override { return chunks_; }
  int chunk_slots(int) const override { return slots_; }
  float StageForward(int slot, const int* tokens, const int* targets, const float* input, int b,
                     int t) override {
    EXPECT_TRUE(b == kB && t == kT);
    if (check_slots) {
      EXPECT_FALSE(busy_[slot]) << "stage " << stage_ << ": forward into busy slot " << slot;
      busy_[slot] = true;
    }
    const int c = slot / slots_;
    if (First(c)) {
      EXPECT_EQ(input, nullptr);
      Embed(tokens, x_[slot].data());
    } else {
      std::copy(input, input + kN, x_[slot].begin());
    }
    Scale(w_[c], x_[slot].data(), y_[slot].data());
    if (!Last(c) || targets == nullptr) return 0;
    std::copy(targets, targets + kB * kT, targets_[slot].begin());
    return Loss(y_[slot].data(), targets_[slot].data(), nullptr);
  }
  const float* StageOutput(int slot) const override {
    return Last(slot / slots_) ? nullptr : y_[slot].data();
  }
  void StageBackward(int slot, float loss_scale, const float* doutput) override {
    EXPECT_TRUE(busy_[slot] || !check_slots)
        << "stage " << stage_ << ": backward of free slot " << slot;
    busy_[slot] = false;
    const int c = slot / slots_;
    std::vector<float> dy(kN);
    if (Last(c)) {
      EXPECT_EQ(doutput, nullptr);
      Loss(y_[slot].data(), targets_[slot].data(), dy.data());
    } else {
      std::copy(doutput, doutput + kN, dy.begin());
    }
    backward_first_ = First(c);
    ScaleBackward(w_[c], x_[slot].data(), dy.data(), loss_scale, &chunk_dw[c],
                  backward_first_ ? nullptr : dx_.data());
    // dx_ is overwritten by the next backward while the previous stage may
    // not have received it yet: the executor must send a copy.
  }
  const float* InputGrad() const override { return backward_first_ ? nullptr : dx_.data(); }

  std::vector<float> chunk_dw;  // accumulated gradient of each chunk's w
  bool check_slots = true;      // off for forward-only passes, which free no slot

 private:
  model::ModelConfig config_;
  model::ParamLayout layout_;
  model::ActivationTable table_;
  // The pipeline's first virtual stage (reads tokens) and last (the loss).
  bool First(int c) const { return stage_ == 0 && c == 0; }
  bool Last(int c) const { return stage_ == stages_ - 1 && c == chunks_ - 1; }

  const int stage_, stages_, slots_, chunks_;
  engine::HostFlatMath math_{nullptr};
  std::vector<float> w_;
  bool backward_first_ = false;
  std::vector<std::vector<float>> x_, y_;
  std::vector<std::vector<int>> targets_;
  std::vector<bool> busy_;
  std::vector<float> dx_;
};

struct Reference {
  double loss_sum = 0;            // over every step and micro-batch
  std::vector<double> step_loss;  // per step
  std::vector<float> dw;          // per stage
};

// The same steps in one thread: micro-batch after micro-batch, forward
// through every stage, then backward.
Reference Sequential(int stages, int m, int steps, float loss_scale) {
  Reference ref;
  ref.dw.assign(stages, 0.0f);
  for (int step = 0; step < steps; ++step) {
    double step_loss = 0;
    for (int micro = 0; micro < m; ++micro) {
      std::vector<int> tokens(kB * kT), targets(kB * kT);
      (void)Fill(step, micro, tokens.data(), targets.data());
      std::vector<std::vector<float>> x(stages + 1, std::vector<float>(kN));
      Embed(tokens.data(), x[0].data());
      for (int s = 0; s < stages; ++s) Scale(Weight(s), x[s].data(), x[s + 1].data());
      std::vector<float> dy(kN), dx(kN);
      step_loss += Loss(x[stages].data(), targets.data(), dy.data());
      for (int s = stages - 1; s >= 0; --s) {
        ScaleBackward(Weight(s), x[s].data(), dy.data(), loss_scale, &ref.dw[s], dx.data());
        dy = dx;
      }
    }
    ref.step_loss.push_back(step_loss);
    ref.loss_sum += step_loss;
  }
  return ref;
}

struct Case {
  PipelineSchedule schedule;
  int stages, m;
  int chunks = 1;  // interleaved (1F1B) over this many model chunks per stage
};

std::string Name(const Case& c) {
  return absl::StrCat(std::string(EnumName(c.schedule)), " pp ", c.stages, " m ", c.m,
                      c.chunks > 1 ? absl::StrCat(" v ", c.chunks) : "");
}

// Two steps of case `c`; checks losses, gradients, brackets and timelines.
void CheckAgainstSequential(const Case& c) {
  SCOPED_TRACE(Name(c));
  constexpr int kSteps = 2;
  const float loss_scale = 1.0f / static_cast<float>(c.m);
  // Model chunks are virtual stages of the sequential computation.
  const Reference ref = Sequential(c.stages * c.chunks, c.m, kSteps, loss_scale);
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(1, 1, c.stages);
  ASSERT_TRUE(dims.ok());
  std::vector<float> dw(c.stages * c.chunks, -1.0f);
  std::vector<std::vector<double>> losses(c.stages);
  RunRanks(c.stages, [&](comm::Communicator& world) {
    const int s = world.rank();
    absl::StatusOr<std::unique_ptr<Mesh>> mesh = Mesh::Create(*dims, s, &world, c.chunks);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    // Just the slots the schedule needs (the busiest chunk's), so that
    // slots are reused.
    const std::vector<PipelineAction> actions =
        PipelineActions(c.schedule, s, c.stages, c.m, c.chunks);
    int slots = 0;
    for (int n : PeakInFlightPerChunk(actions, c.chunks)) slots = std::max(slots, n);
    FakeStage engine(s, c.stages, slots, c.chunks);
    absl::StatusOr<std::unique_ptr<PipelineExecutor>> exec =
        PipelineExecutor::Create(&engine, **mesh, c.schedule, c.m);
    ASSERT_TRUE(exec.ok()) << exec.status();
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::string> calls;
      auto fill = [step](int micro, int* tokens, int* targets) {
        return Fill(step, micro, tokens, targets);
      };
      auto before = [&calls](int micro) {
        calls.push_back(absl::StrCat("begin ", micro));
        return absl::OkStatus();
      };
      auto after = [&calls](int micro) {
        calls.push_back(absl::StrCat("end ", micro));
        return absl::OkStatus();
      };
      absl::StatusOr<PipelineStepResult> r = (*exec)->RunStep(fill, before, after, loss_scale);
      ASSERT_TRUE(r.ok()) << "stage " << s << ": " << r.status();
      losses[s].push_back(r->loss_sum);
      // Around every backward, by its ordinal: m · v passes.
      std::vector<std::string> want;
      for (int pass = 0; pass < c.m * c.chunks; ++pass) {
        want.push_back(absl::StrCat("begin ", pass));
        want.push_back(absl::StrCat("end ", pass));
      }
      EXPECT_EQ(calls, want) << "stage " << s;
      // The timeline: one entry per action, in the schedule's order.
      ASSERT_EQ(r->actions.size(), (*exec)->actions().size());
      double prev_end = 0;
      for (size_t i = 0; i < r->actions.size(); ++i) {
        const ActionTiming& t = r->actions[i];
        EXPECT_EQ(t.kind, (*exec)->actions()[i].kind);
        EXPECT_EQ(t.micro, (*exec)->actions()[i].micro);
        EXPECT_EQ(t.chunk, (*exec)->actions()[i].chunk);
        EXPECT_GE(t.start_ms, prev_end);
        EXPECT_GE(t.end_ms, t.start_ms + t.wait_ms);
        EXPECT_GE(t.wait_ms, 0);
        prev_end = t.end_ms;
      }
      EXPECT_GE(r->step_ms, prev_end);
      EXPECT_GE(r->idle_fraction, 0);
      EXPECT_LE(r->idle_fraction, 1);
    }
    for (int k = 0; k < c.chunks; ++k) dw[k * c.stages + s] = engine.chunk_dw[k];
  });
  for (size_t v = 0; v < dw.size(); ++v) {
    EXPECT_EQ(dw[v], ref.dw[v]) << "virtual stage " << v << " gradient";
  }
  for (int s = 0; s < c.stages; ++s) {
    ASSERT_EQ(losses[s].size(), size_t(kSteps));
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_EQ(losses[s][step], s == c.stages - 1 ? ref.step_loss[step] : 0.0)
          << "stage " << s << " step " << step;
    }
  }
}

TEST(PipelineTest, MatchesSequentialComputation) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B}) {
    for (int stages : {2, 4}) {
      for (int m : {1, 4, 8}) CheckAgainstSequential({schedule, stages, m});
    }
  }
}

// Odd stage counts, fewer micro-batches than stages, and a long pipeline
// with many in flight.
TEST(PipelineTest, OtherShapesMatchSequentialComputation) {
  CheckAgainstSequential({PipelineSchedule::k1F1B, 3, 5});
  CheckAgainstSequential({PipelineSchedule::kGpipe, 3, 2});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 8, 3});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 8, 16});
  CheckAgainstSequential({PipelineSchedule::kGpipe, 8, 16});
}

// Interleaved 1F1B: each stage two or three model chunks, messages on the
// one-way channels (stage pp − 1's chunk c hands on to stage 0's chunk
// c + 1), every virtual stage's gradient and the losses bit for bit.
TEST(PipelineTest, InterleavedMatchesSequentialComputation) {
  CheckAgainstSequential({PipelineSchedule::k1F1B, 2, 2, 2});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 2, 4, 2});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 2, 8, 3});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 3, 6, 2});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 4, 8, 2});
}

TEST(PipelineTest, OneStageNeedsNoCommunicators) {
  CheckAgainstSequential({PipelineSchedule::kGpipe, 1, 4});
  CheckAgainstSequential({PipelineSchedule::k1F1B, 1, 3});
}

TEST(PipelineTest, ForwardOnlyMatchesSequentialLosses) {
  constexpr int kStages = 3, kMicro = 5;
  const Reference ref = Sequential(kStages, kMicro, 1, 1.0f);
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(1, 1, kStages);
  ASSERT_TRUE(dims.ok());
  std::vector<double> loss(kStages, -1);
  RunRanks(kStages, [&](comm::Communicator& world) {
    const int s = world.rank();
    absl::StatusOr<std::unique_ptr<Mesh>> mesh = Mesh::Create(*dims, s, &world);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    FakeStage engine(s, kStages, kStages);
    engine.check_slots = false;
    absl::StatusOr<std::unique_ptr<PipelineExecutor>> exec =
        PipelineExecutor::Create(&engine, **mesh, PipelineSchedule::k1F1B, 2);
    ASSERT_TRUE(exec.ok()) << exec.status();
    absl::StatusOr<double> l = (*exec)->RunForwardOnly(
        kMicro, [](int micro, int* t, int* y) { return Fill(0, micro, t, y); });
    ASSERT_TRUE(l.ok()) << l.status();
    loss[s] = *l;
    EXPECT_EQ(engine.chunk_dw, std::vector<float>{0.0f});  // no backward
  });
  EXPECT_EQ(loss, (std::vector<double>{0, 0, ref.loss_sum}));
}

TEST(PipelineTest, TooFewSlotsIsRejected) {
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(1, 1, 2);
  ASSERT_TRUE(dims.ok());
  RunRanks(2, [&](comm::Communicator& world) {
    absl::StatusOr<std::unique_ptr<Mesh>> mesh = Mesh::Create(*dims, world.rank(), &world);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    // 1F1B holds 2 micro-batches on stage 0 of 2, GPipe all 4 everywhere.
    FakeStage one(world.rank(), 2, 1);
    auto f1b = PipelineExecutor::Create(&one, **mesh, PipelineSchedule::k1F1B, 4);
    EXPECT_EQ(f1b.ok(), world.rank() == 1) << f1b.status();
    if (world.rank() == 0) {
      EXPECT_EQ(f1b.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(f1b.status().message().find("holds up to 2"), std::string::npos) << f1b.status();
    }
    FakeStage three(world.rank(), 2, 3);
    auto gpipe = PipelineExecutor::Create(&three, **mesh, PipelineSchedule::kGpipe, 4);
    EXPECT_EQ(gpipe.status().code(), absl::StatusCode::kInvalidArgument) << gpipe.status();
    EXPECT_TRUE(PipelineExecutor::Create(&three, **mesh, PipelineSchedule::kGpipe, 3).ok());
  });
}

TEST(PipelineTest, MismatchedCommunicatorsAreRejected) {
  FakeStage engine(0, 2, 4);
  EXPECT_EQ(PipelineExecutor::Create(&engine, nullptr, nullptr, 0, 2, PipelineSchedule::k1F1B, 4)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PipelineExecutor::Create(&engine, nullptr, nullptr, 2, 2, PipelineSchedule::k1F1B, 4)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PipelineExecutor::Create(&engine, nullptr, nullptr, 0, 1, PipelineSchedule::k1F1B, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PipelineTest, SilentNeighbourTimesOut) {
  comm::GlooOptions options;
  options.timeout = absl::Seconds(1);
  options.dump_on_failure = false;
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(1, 1, 2);
  ASSERT_TRUE(dims.ok());
  absl::Notification last_done;
  RunRanks(
      2,
      [&](comm::Communicator& world) {
        absl::StatusOr<std::unique_ptr<Mesh>> mesh = Mesh::Create(*dims, world.rank(), &world);
        ASSERT_TRUE(mesh.ok()) << mesh.status();
        if (world.rank() == 0) {  // the first stage never runs its step
          EXPECT_TRUE(last_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
          return;
        }
        FakeStage engine(1, 2, 1);
        absl::StatusOr<std::unique_ptr<PipelineExecutor>> exec =
            PipelineExecutor::Create(&engine, **mesh, PipelineSchedule::k1F1B, 2);
        ASSERT_TRUE(exec.ok()) << exec.status();
        const absl::Time start = absl::Now();
        absl::StatusOr<PipelineStepResult> r = (*exec)->RunStep(
            [](int micro, int* t, int* y) { return Fill(0, micro, t, y); }, nullptr, nullptr, 1);
        const absl::Duration took = absl::Now() - start;
        last_done.Notify();
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
        EXPECT_NE(r.status().message().find("pipeline stage 1/2 F0: receiving activations from "
                                            "stage 0"),
                  std::string::npos)
            << r.status();
        EXPECT_LT(took, absl::Seconds(10));
      },
      options);
}

// Interleaved, the last stage never runs: stage 0 forwards F0 and F1 (their
// sends wait in their channel) and then waits for F0.1's input from the
// last stage, around the ring — failing with the channel's timeout.
TEST(PipelineTest, InterleavedSilentNeighbourTimesOut) {
  comm::GlooOptions options;
  options.timeout = absl::Seconds(1);
  options.dump_on_failure = false;
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(1, 1, 2);
  ASSERT_TRUE(dims.ok());
  absl::Notification first_done;
  RunRanks(
      2,
      [&](comm::Communicator& world) {
        absl::StatusOr<std::unique_ptr<Mesh>> mesh =
            Mesh::Create(*dims, world.rank(), &world, /*chunks=*/2);
        ASSERT_TRUE(mesh.ok()) << mesh.status();
        if (world.rank() == 1) {  // the last stage never runs its step
          EXPECT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
          return;
        }
        FakeStage engine(0, 2, 4, /*chunks=*/2);
        absl::StatusOr<std::unique_ptr<PipelineExecutor>> exec =
            PipelineExecutor::Create(&engine, **mesh, PipelineSchedule::k1F1B, 4);
        ASSERT_TRUE(exec.ok()) << exec.status();
        const absl::Time start = absl::Now();
        absl::StatusOr<PipelineStepResult> r = (*exec)->RunStep(
            [](int micro, int* t, int* y) { return Fill(0, micro, t, y); }, nullptr, nullptr, 1);
        const absl::Duration took = absl::Now() - start;
        first_done.Notify();
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
        EXPECT_NE(r.status().message().find("pipeline stage 0/2 F0.1: receiving activations from "
                                            "stage 1"),
                  std::string::npos)
            << r.status();
        EXPECT_LT(took, absl::Seconds(10));
      },
      options);
}

}  // namespace
}  // namespace shardtrain::parallel
