#include "common/planner.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"

namespace shardtrain {
namespace {

const std::string kSourceDir = SHARDTRAIN_SOURCE_DIR;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A model every tp in 1..4 divides (NH = 12, C = 96) with 5 layers, so pp = 2..4
// splits them unevenly; the batch divides by micro·dp for every dp in 1..4.
JobSpec SmallSpec(int dp, int tp, int pp) {
  JobSpec s;
  s.name = "small";
  s.model = {"", /*layers=*/5, /*heads=*/12, /*dim=*/96, /*context=*/16, /*vocab=*/100};
  s.data.train = "data/x.txt";
  s.batch = {/*global=*/48, /*micro=*/2, /*seq_len=*/16};
  s.parallel.dp = dp;
  s.parallel.tp = tp;
  s.parallel.pp = pp;
  s.steps = 1;
  return s;
}

model::ParamLayout LayoutOf(const JobSpec& s) {
  return model::ParamLayout(*model::MakeGptConfig(s.model.layers, s.model.heads, s.model.dim,
                                                  s.model.context, s.model.vocab));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ----------------------------------------------------------------------------
// Reference model of memory and communication, written from the formulas in
// planner.h independently of planner.cc: per stage, the resident units (blocks
// of the stage, embeddings on the first and last, final on the last), block
// units divided by tp, each part sharded per unit over dp by the ZeRO stage.

struct Reference {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, comm_buffer = 0, total = 0;
  int64_t comm = 0;
};

Reference ReferenceFor(const JobSpec& s, const v1::Plan& plan, int stage) {
  const model::ParamLayout layout = LayoutOf(s);
  const int dp = s.parallel.dp, tp = s.parallel.tp, pp = s.parallel.pp, zero = s.parallel.zero;
  const int m = s.GradAccumSteps();
  const bool mixed = s.precision != Precision::kFp32;
  const int64_t pb = mixed ? 2 : 4, ob = mixed ? 12 : 8, ab = pb;
  const v1::PipelineStage& st = plan.stages(stage);
  const bool first = stage == 0, last = stage == pp - 1;
  Reference r;
  int64_t shard_sum = 0, largest = 0, local = 0;
  for (const model::UnitInfo& u : layout.units()) {
    int64_t n = u.numel;
    if (u.name == "embeddings") {
      if (!first && !last) continue;
    } else if (u.name == "final") {
      if (!last) continue;
    } else {
      int l = std::stoi(u.name.substr(std::string("block.").size()));
      if (l < st.first_layer() || l >= st.first_layer() + st.num_layers()) continue;
      n = CeilDiv(n, tp);
    }
    const int64_t shard = CeilDiv(n, dp);
    r.params += pb * (zero == 3 ? shard : n);
    r.grads += pb * (zero >= 2 ? shard : n);
    r.optimizer += ob * (zero >= 1 ? shard : n);
    shard_sum += shard;
    local += n;
    largest = std::max(largest, n);
  }
  const int64_t B = s.batch.micro, T = s.batch.seq_len, C = s.model.dim, NH = s.model.heads;
  const int64_t Vp = model::PaddedVocab(s.model.vocab), L = st.num_layers();
  int64_t per_mb = L * (16 * B * T * C + 2 * B * (NH / tp) * T * T) * ab;
  if (last) per_mb += B * T * Vp * ab + 2 * B * T * C * ab;
  if (first) per_mb += B * T * C * ab;
  int64_t alive = 1;
  if (pp > 1) {
    alive = s.parallel.schedule == PipelineSchedule::kGpipe ? m : std::min<int64_t>(pp - stage, m);
  }
  r.activations = per_mb * alive;
  if (dp > 1) {
    r.comm_buffer =
        zero == 3 ? 2 * largest * pb : std::min(int64_t{s.parallel.bucket_mb} << 20, local * pb);
  }
  r.total = r.params + r.grads + r.optimizer + r.activations + r.comm_buffer;

  // One ring pass over the rank's model slice: (dp-1)/dp of it, padded per unit.
  const int64_t pass = (dp - 1) * shard_sum * pb;
  if (dp > 1) {
    if (zero == 0) r.comm += 2 * pass;                 // all-reduce grads
    if (zero == 1) r.comm += 2 * pass + pass;          // + all-gather params
    if (zero == 2) r.comm += m * pass + pass;          // reduce-scatter per micro-batch
    if (zero == 3) r.comm += m * pass + 2 * m * pass;  // + 2 gathers per micro-batch
  }
  if (tp > 1) r.comm += m * L * 4 * 2 * (tp - 1) * CeilDiv(B * T * C, tp) * ab;
  r.comm += m * ((last ? 0 : 1) + (first ? 0 : 1)) * B * T * C * ab;
  return r;
}

// ----------------------------------------------------------------------------
// Every (dp, tp, pp) in {1,2,3,4}^3 with dp·tp·pp <= 16.

using Mesh = std::tuple<int, int, int>;

std::vector<Mesh> AllMeshes() {
  std::vector<Mesh> out;
  for (int dp = 1; dp <= 4; ++dp)
    for (int tp = 1; tp <= 4; ++tp)
      for (int pp = 1; pp <= 4; ++pp)
        if (dp * tp * pp <= 16) out.emplace_back(dp, tp, pp);
  return out;
}

class PlanMeshTest : public testing::TestWithParam<Mesh> {
 protected:
  int dp() const { return std::get<0>(GetParam()); }
  int tp() const { return std::get<1>(GetParam()); }
  int pp() const { return std::get<2>(GetParam()); }
  int world() const { return dp() * tp() * pp(); }
  v1::Plan Plan(const JobSpec& s) const {
    absl::StatusOr<v1::Plan> p = MakePlan(s, world());
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : v1::Plan();
  }
};

TEST_P(PlanMeshTest, HeaderFields) {
  JobSpec s = SmallSpec(dp(), tp(), pp());
  s.parallel.zero = 2;
  const v1::Plan p = Plan(s);
  EXPECT_EQ(p.world(), world());
  EXPECT_EQ(p.dp(), dp());
  EXPECT_EQ(p.tp(), tp());
  EXPECT_EQ(p.pp(), pp());
  EXPECT_EQ(p.zero_stage(), 2);
  EXPECT_EQ(p.micro_batch(), 2);
  EXPECT_EQ(p.grad_accum_steps(), 48 / (2 * dp()));
  EXPECT_EQ(p.seq_len(), 16);
  EXPECT_EQ(p.global_batch(), 48);
  EXPECT_EQ(p.schedule(), "1f1b");
  EXPECT_EQ(p.num_params(), static_cast<int64_t>(LayoutOf(s).num_params()));
  EXPECT_TRUE(p.job_id().empty());
}

TEST_P(PlanMeshTest, CoordinatesAreABijectionInMegatronOrder) {
  const v1::Plan p = Plan(SmallSpec(dp(), tp(), pp()));
  ASSERT_EQ(p.ranks_size(), world());
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < world(); ++r) {
    const v1::RankPlan& rp = p.ranks(r);
    EXPECT_EQ(rp.rank(), r);
    ASSERT_GE(rp.dp(), 0);
    ASSERT_LT(rp.dp(), dp());
    ASSERT_GE(rp.tp(), 0);
    ASSERT_LT(rp.tp(), tp());
    ASSERT_GE(rp.pp(), 0);
    ASSERT_LT(rp.pp(), pp());
    EXPECT_EQ((rp.pp() * dp() + rp.dp()) * tp() + rp.tp(), r);
    EXPECT_TRUE(seen.insert({rp.dp(), rp.tp(), rp.pp()}).second) << "rank " << r;
    EXPECT_TRUE(rp.worker_id().empty());
    // Data: each dp slice reads its own contiguous global/dp samples.
    EXPECT_EQ(rp.num_samples(), 48 / dp());
    EXPECT_EQ(rp.first_sample(), rp.dp() * (48 / dp()));
  }
  EXPECT_EQ(static_cast<int>(seen.size()), world());
}

TEST_P(PlanMeshTest, GroupsPartitionTheWorldAlongEachAxis) {
  const v1::Plan p = Plan(SmallSpec(dp(), tp(), pp()));
  const std::map<std::string, int> size = {{"dp", dp()}, {"tp", tp()}, {"pp", pp()}};
  std::map<std::string, std::vector<int>> covered;  // kind -> times each rank appears
  std::map<std::string, int> next_index;
  for (const auto& [kind, n] : size) covered[kind].assign(world(), 0);
  for (const v1::Group& g : p.groups()) {
    ASSERT_TRUE(size.count(g.kind())) << g.kind();
    EXPECT_EQ(g.index(), next_index[g.kind()]++) << g.kind();
    ASSERT_EQ(g.ranks_size(), size.at(g.kind()));
    const v1::RankPlan& head = p.ranks(g.ranks(0));
    for (int i = 0; i < g.ranks_size(); ++i) {
      const v1::RankPlan& r = p.ranks(g.ranks(i));
      covered[g.kind()][r.rank()]++;
      // Group rank i is coordinate i along the axis; the other two agree.
      if (g.kind() == "dp") {
        EXPECT_EQ(r.dp(), i);
        EXPECT_EQ(r.tp(), head.tp());
        EXPECT_EQ(r.pp(), head.pp());
      } else if (g.kind() == "tp") {
        EXPECT_EQ(r.tp(), i);
        EXPECT_EQ(r.dp(), head.dp());
        EXPECT_EQ(r.pp(), head.pp());
      } else {
        EXPECT_EQ(r.pp(), i);
        EXPECT_EQ(r.dp(), head.dp());
        EXPECT_EQ(r.tp(), head.tp());
      }
    }
  }
  for (const auto& [kind, n] : size) {
    EXPECT_EQ(next_index[kind], world() / n) << kind;
    for (int r = 0; r < world(); ++r) EXPECT_EQ(covered[kind][r], 1) << kind << " rank " << r;
  }
}

TEST_P(PlanMeshTest, LayoutIsTheParamLayout) {
  const JobSpec s = SmallSpec(dp(), tp(), pp());
  const v1::Plan p = Plan(s);
  const model::ParamLayout layout = LayoutOf(s);
  ASSERT_EQ(p.layout_size(), static_cast<int>(layout.tensors().size()));
  for (int i = 0; i < p.layout_size(); ++i) {
    const model::TensorInfo& t = layout.tensors()[i];
    EXPECT_EQ(p.layout(i).name(), t.name);
    EXPECT_EQ(std::vector<int64_t>(p.layout(i).shape().begin(), p.layout(i).shape().end()),
              t.shape);
    EXPECT_EQ(p.layout(i).offset(), static_cast<int64_t>(t.offset));
    EXPECT_EQ(p.layout(i).unit(), layout.units()[t.unit].name);
    EXPECT_EQ(p.layout(i).decay(), t.decay);
  }
}

// Shared by the mesh sweep and the odd-size sweep below.
void ExpectShardsPartitionUnits(const v1::Plan& p, const model::ParamLayout& layout, int dp) {
  ASSERT_EQ(p.units_size(), static_cast<int>(layout.units().size()));
  int64_t next_unit = 0;
  for (int i = 0; i < p.units_size(); ++i) {
    const v1::ShardUnit& u = p.units(i);
    SCOPED_TRACE(u.name());
    EXPECT_EQ(u.name(), layout.units()[i].name);
    EXPECT_EQ(u.offset(), next_unit);
    EXPECT_EQ(u.numel(), static_cast<int64_t>(layout.units()[i].numel));
    next_unit += u.numel();
    EXPECT_EQ(u.padded_numel() % dp, 0);
    EXPECT_GE(u.padded_numel(), u.numel());
    EXPECT_LT(u.padded_numel() - u.numel(), dp);
    ASSERT_EQ(u.shard_offsets_size(), dp);
    ASSERT_EQ(u.shard_sizes_size(), dp);
    int64_t expect_offset = 0, sum = 0;
    for (int d = 0; d < dp; ++d) {
      EXPECT_EQ(u.shard_offsets(d), expect_offset) << "dp rank " << d;  // contiguous, disjoint
      EXPECT_GE(u.shard_sizes(d), 0);
      EXPECT_LE(u.shard_sizes(d), u.padded_numel() / dp);
      // Even split of the padded unit: rank d's real part starts at d·(padded/dp).
      if (u.shard_sizes(d) > 0) {
        EXPECT_EQ(u.shard_offsets(d), d * (u.padded_numel() / dp));
      }
      expect_offset += u.shard_sizes(d);
      sum += u.shard_sizes(d);
    }
    EXPECT_EQ(sum, u.numel());
  }
  EXPECT_EQ(next_unit, static_cast<int64_t>(layout.num_params()));
}

TEST_P(PlanMeshTest, ShardsPartitionEachUnit) {
  const JobSpec s = SmallSpec(dp(), tp(), pp());
  ExpectShardsPartitionUnits(Plan(s), LayoutOf(s), dp());
}

TEST_P(PlanMeshTest, StagesPartitionLayersEvenly) {
  const v1::Plan p = Plan(SmallSpec(dp(), tp(), pp()));
  ASSERT_EQ(p.stages_size(), pp());
  int next = 0;
  for (int s = 0; s < pp(); ++s) {
    const v1::PipelineStage& st = p.stages(s);
    EXPECT_EQ(st.stage(), s);
    EXPECT_EQ(st.first_layer(), next);
    // 5 layers: the first 5 % pp stages get one extra.
    EXPECT_EQ(st.num_layers(), 5 / pp() + (s < 5 % pp() ? 1 : 0)) << "stage " << s;
    next += st.num_layers();
  }
  EXPECT_EQ(next, 5);
}

TEST_P(PlanMeshTest, BubbleFraction) {
  for (PipelineSchedule sched : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B}) {
    JobSpec s = SmallSpec(dp(), tp(), pp());
    s.parallel.schedule = sched;
    const v1::Plan p = Plan(s);
    const double m = 48.0 / (2 * dp()), pf = pp();
    EXPECT_DOUBLE_EQ(p.bubble_fraction(), pp() == 1 ? 0.0 : (pf - 1) / (m + pf - 1));
    EXPECT_EQ(p.schedule(), sched == PipelineSchedule::kGpipe ? "gpipe" : "1f1b");
  }
}

TEST_P(PlanMeshTest, MemoryAndCommMatchTheModelForEveryZeroStage) {
  for (Precision prec : {Precision::kFp32, Precision::kBf16}) {
    for (PipelineSchedule sched : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B}) {
      for (int zero = 0; zero <= 3; ++zero) {
        JobSpec s = SmallSpec(dp(), tp(), pp());
        s.precision = prec;
        s.parallel.schedule = sched;
        s.parallel.zero = zero;
        SCOPED_TRACE(testing::Message() << "zero " << zero << " precision " << EnumName(prec)
                                        << " schedule " << EnumName(sched));
        const v1::Plan p = Plan(s);
        // The busiest stage, by total memory (first on ties) and by bytes sent.
        Reference want;
        int64_t want_comm = 0;
        for (int st = 0; st < pp(); ++st) {
          Reference r = ReferenceFor(s, p, st);
          if (st == 0 || r.total > want.total) want = r;
          want_comm = std::max(want_comm, r.comm);
        }
        const v1::MemoryEstimate& got = p.memory_per_rank();
        EXPECT_EQ(got.params_bytes(), want.params);
        EXPECT_EQ(got.grads_bytes(), want.grads);
        EXPECT_EQ(got.optimizer_bytes(), want.optimizer);
        EXPECT_EQ(got.activations_bytes(), want.activations);
        EXPECT_EQ(got.comm_buffer_bytes(), want.comm_buffer);
        EXPECT_EQ(got.total_bytes(), want.total);
        EXPECT_EQ(p.comm_bytes_per_step(), want_comm);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllMeshesUpTo16, PlanMeshTest, testing::ValuesIn(AllMeshes()),
                         [](const testing::TestParamInfo<Mesh>& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_tp" +
                                  std::to_string(std::get<1>(info.param)) + "_pp" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Units whose sizes no dp divides (final = 2C = 10 elements), dp up to 16 so
// that some shards are partial and some empty.
TEST(PlanShardsTest, OddUnitSizesAnyDp) {
  for (int dp = 1; dp <= 16; ++dp) {
    SCOPED_TRACE(testing::Message() << "dp " << dp);
    JobSpec s = SmallSpec(dp, 1, 1);
    s.model = {"", /*layers=*/2, /*heads=*/1, /*dim=*/5, /*context=*/3, /*vocab=*/7};
    s.batch = {/*global=*/dp, /*micro=*/1, /*seq_len=*/3};
    absl::StatusOr<v1::Plan> p = MakePlan(s, dp);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectShardsPartitionUnits(*p, LayoutOf(s), dp);
  }
  // One exact case: final (10 elements) over 16 ranks: 10 of 1, then 6 empty.
  JobSpec s = SmallSpec(16, 1, 1);
  s.model = {"", 2, 1, 5, 3, 7};
  s.batch = {16, 1, 3};
  const v1::ShardUnit u = MakePlan(s, 16)->units(3);
  ASSERT_EQ(u.name(), "final");
  EXPECT_EQ(u.padded_numel(), 16);
  for (int d = 0; d < 16; ++d) {
    EXPECT_EQ(u.shard_sizes(d), d < 10 ? 1 : 0);
    EXPECT_EQ(u.shard_offsets(d), std::min(d, 10));
  }
}

// ----------------------------------------------------------------------------
// Memory, by hand and against the ZeRO paper.

// The brief's formulas written out for tp = pp = 1, using the plan's own
// padded units: sharded parts hold padded_numel/dp per unit.
TEST(PlanMemoryTest, ZeroStagesOnDataParallelOnly) {
  for (int dp : {1, 2, 3, 4, 8}) {
    for (bool mixed : {false, true}) {
      for (int zero = 0; zero <= 3; ++zero) {
        JobSpec s = SmallSpec(dp, 1, 1);
        s.batch.global = 2 * dp;  // m = 1
        s.parallel.zero = zero;
        s.precision = mixed ? Precision::kBf16 : Precision::kFp32;
        SCOPED_TRACE(testing::Message() << "dp " << dp << " zero " << zero << " mixed " << mixed);
        const v1::Plan p = *MakePlan(s, dp);
        int64_t n = 0, n_shard = 0;
        for (const v1::ShardUnit& u : p.units()) {
          n += u.numel();
          n_shard += u.padded_numel() / dp;
        }
        ASSERT_EQ(n, p.num_params());
        const int64_t pb = mixed ? 2 : 4, ob = mixed ? 12 : 8;
        const v1::MemoryEstimate& mem = p.memory_per_rank();
        EXPECT_EQ(mem.params_bytes(), pb * (zero >= 3 ? n_shard : n));
        EXPECT_EQ(mem.grads_bytes(), pb * (zero >= 2 ? n_shard : n));
        EXPECT_EQ(mem.optimizer_bytes(), ob * (zero >= 1 ? n_shard : n));
        // Same thing through the exported helper, unit by unit.
        int64_t helper = 0;
        for (const v1::ShardUnit& u : p.units()) {
          helper += ZeroMemoryBytes(u.numel(), dp, zero, mixed).Total();
        }
        EXPECT_EQ(mem.params_bytes() + mem.grads_bytes() + mem.optimizer_bytes(), helper);

        // Activations, llm.c style, one micro-batch (B=2, T=16, C=96, NH=12, L=5, Vp=128).
        const int64_t B = 2, T = 16, C = 96, NH = 12, L = 5, Vp = 128, ab = pb;
        EXPECT_EQ(mem.activations_bytes(),
                  (L * (16 * B * T * C + 2 * B * NH * T * T) + B * T * Vp + 3 * B * T * C) * ab);
        int64_t largest = 0;  // a block: 12C² + 13C > (Vp + context)·C here
        for (const v1::ShardUnit& u : p.units()) largest = std::max(largest, u.numel());
        EXPECT_EQ(largest, p.units(1).numel());
        // The 25 MiB bucket is capped at the whole gradient (n·pb < 25 MiB here).
        ASSERT_LT(n * pb, 25 << 20);
        EXPECT_EQ(mem.comm_buffer_bytes(), dp == 1 ? 0 : zero == 3 ? 2 * largest * pb : n * pb);
        EXPECT_EQ(mem.total_bytes(), mem.params_bytes() + mem.grads_bytes() +
                                         mem.optimizer_bytes() + mem.activations_bytes() +
                                         mem.comm_buffer_bytes());

        // Bytes sent per step (m = 1): G = grads, P = params of the padded model.
        const int64_t G = pb * dp * n_shard, P = G;  // padded bytes
        const int64_t f = dp - 1;                    // ring: (dp-1)/dp of the buffer
        int64_t want = 0;
        if (zero == 0) want = 2 * f * G / dp;
        if (zero == 1) want = 2 * f * G / dp + f * P / dp;
        if (zero == 2) want = f * G / dp + f * P / dp;
        if (zero == 3) want = f * (G + 2 * P) / dp;
        EXPECT_EQ(p.comm_bytes_per_step(), want);
      }
    }
  }
}

TEST(PlanMemoryTest, FortunesDdpByHand) {
  // L=4 NH=4 C=128 context=128 V=Vp=256, dp 4, fp32, ZeRO-0, micro 8, T 64.
  JobSpec s = SmallSpec(4, 1, 1);
  s.model = {"", 4, 4, 128, 128, 256};
  s.batch = {32, 8, 64};
  const v1::Plan p = *MakePlan(s, 4);
  // embeddings (256+128)·128 = 49152; block 12·128² + 13·128 = 198272; final 256.
  const int64_t n = 49152 + 4 * 198272 + 256;
  EXPECT_EQ(p.num_params(), n);
  EXPECT_EQ(p.memory_per_rank().params_bytes(), 4 * n);
  EXPECT_EQ(p.memory_per_rank().grads_bytes(), 4 * n);
  EXPECT_EQ(p.memory_per_rank().optimizer_bytes(), 8 * n);
  EXPECT_EQ(p.memory_per_rank().activations_bytes(),
            (4 * (16 * 8 * 64 * 128 + 2 * 8 * 4 * 64 * 64) + 8 * 64 * 256 + 3 * 8 * 64 * 128) * 4);
  EXPECT_EQ(p.comm_bytes_per_step(), 2 * 3 * n);  // all-reduce: 2·(3/4)·4n bytes, n % 4 == 0
}

// ZeRO paper, Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12):
// 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device for baseline, P_os, P_os+g, P_os+g+p.
TEST(PlanMemoryTest, ZeroPaperExample) {
  const int64_t psi = 7'500'000'000;
  const double paper_gb[4] = {120, 31.4, 16.6, 1.9};
  const double exact_gb[4] = {120, 30 + 90.0 / 64, 15 + 105.0 / 64, 120.0 / 64};
  for (int stage = 0; stage <= 3; ++stage) {
    const double gb = ZeroMemoryBytes(psi, 64, stage, /*mixed=*/true).Total() / 1e9;
    EXPECT_NEAR(gb, exact_gb[stage], 1e-6) << "stage " << stage;
    // The paper prints one decimal: agree to that rounding (1.875 -> 1.9).
    EXPECT_NEAR(gb, paper_gb[stage], 0.05 + 1e-9) << "stage " << stage;
    if (stage < 3) {
      EXPECT_NEAR(gb / paper_gb[stage], 1.0, 0.01) << "stage " << stage;
    }
  }
  const ModelStateBytes z2 = ZeroMemoryBytes(psi, 64, 2, true);
  EXPECT_EQ(z2.params, 2 * psi);
  EXPECT_EQ(z2.grads, 2 * CeilDiv(psi, 64));
  EXPECT_EQ(z2.optimizer, 12 * CeilDiv(psi, 64));
  const ModelStateBytes fp32 = ZeroMemoryBytes(1000, 3, 0, false);
  EXPECT_EQ(fp32.Total(), 16 * 1000);
  EXPECT_EQ(ZeroMemoryBytes(1000, 3, 3, false).Total(), 16 * 334);
}

// The same through MakePlan: a ~7.5B-parameter custom GPT (L=36, C=4096) on
// 64 data-parallel ranks; bytes/param of model state per rank follows the
// paper's 16, 4 + 12/64, 2 + 14/64, 16/64 within 1%.
TEST(PlanMemoryTest, ZeroPaperExampleThroughMakePlan) {
  JobSpec s = SmallSpec(64, 1, 1);
  s.model = {"", 36, 32, 4096, 2048, 50257};
  s.batch = {64, 1, 1024};
  s.precision = Precision::kBf16;
  const double want[4] = {16, 4 + 12.0 / 64, 2 + 14.0 / 64, 16.0 / 64};
  for (int zero = 0; zero <= 3; ++zero) {
    s.parallel.zero = zero;
    const v1::Plan p = *MakePlan(s, 64);
    EXPECT_NEAR(p.num_params() / 7.5e9, 1.0, 0.01);
    const v1::MemoryEstimate& m = p.memory_per_rank();
    const double per_param =
        double(m.params_bytes() + m.grads_bytes() + m.optimizer_bytes()) / p.num_params();
    EXPECT_NEAR(per_param / want[zero], 1.0, 0.01) << "zero " << zero;
  }
}

TEST(PlanMemoryTest, PipelineKeepsOnlyItsStageAndSchedulesDiffer) {
  // 4 layers on 2 stages: the last stage holds 2 blocks + embeddings (tied)
  // + final; with 1F1B stage 0 keeps min(pp, m) micro-batches, GPipe all m.
  JobSpec s = SmallSpec(1, 1, 2);
  s.model.layers = 4;
  s.batch = {16, 2, 16};  // m = 8
  const v1::Plan one = *MakePlan(s, 2);
  s.parallel.schedule = PipelineSchedule::kGpipe;
  const v1::Plan gpipe = *MakePlan(s, 2);
  const model::ParamLayout layout = LayoutOf(s);
  const int64_t emb = layout.units()[0].numel, blk = layout.units()[1].numel,
                fin = layout.units().back().numel;
  EXPECT_GT(gpipe.memory_per_rank().activations_bytes(), one.memory_per_rank().activations_bytes());
  const int64_t B = 2, T = 16, C = 96, NH = 12, Vp = 128;
  const int64_t per_layer = (16 * B * T * C + 2 * B * NH * T * T) * 4;
  // GPipe: stage 1 (logits) keeps 8 micro-batches; 1F1B: stage 0 keeps 2, stage 1 keeps 1.
  const int64_t last_mb = 2 * per_layer + (B * T * Vp + 2 * B * T * C) * 4;
  const int64_t first_mb = 2 * per_layer + B * T * C * 4;
  EXPECT_EQ(gpipe.memory_per_rank().activations_bytes(), 8 * last_mb);
  const int64_t stage0 = 4 * 4 * (emb + 2 * blk) + 2 * first_mb;
  const int64_t stage1 = 4 * 4 * (emb + 2 * blk + fin) + last_mb;
  EXPECT_EQ(one.memory_per_rank().total_bytes(), std::max(stage0, stage1));
  EXPECT_EQ(one.memory_per_rank().params_bytes(),
            4 * (stage0 >= stage1 ? emb + 2 * blk : emb + 2 * blk + fin));
  EXPECT_EQ(gpipe.memory_per_rank().params_bytes(), 4 * (emb + 2 * blk + fin));
}

TEST(PlanMemoryTest, BucketSizeBoundsTheCommBuffer) {
  JobSpec s = SmallSpec(2, 1, 1);
  s.parallel.bucket_mb = 1;  // 1 MiB < 4 bytes × ~0.58M params
  const v1::Plan p = *MakePlan(s, 2);
  ASSERT_GT(4 * p.num_params(), 1 << 20);
  EXPECT_EQ(p.memory_per_rank().comm_buffer_bytes(), 1 << 20);
}

TEST(PlanMemoryTest, TensorParallelDividesBlocks) {
  JobSpec s = SmallSpec(1, 4, 1);
  const v1::Plan p = *MakePlan(s, 4);
  const model::ParamLayout layout = LayoutOf(s);
  int64_t want = 0;
  for (const model::UnitInfo& u : layout.units()) {
    want += u.name.rfind("block.", 0) == 0 ? CeilDiv(u.numel, 4) : u.numel;
  }
  EXPECT_EQ(p.memory_per_rank().params_bytes(), 4 * want);
}

TEST(PlanMemoryTest, ReshardAfterForwardFalseKeepsParams) {
  JobSpec s = SmallSpec(4, 1, 1);
  s.parallel.zero = 3;
  const v1::Plan resharded = *MakePlan(s, 4);
  s.parallel.reshard_after_forward = false;
  const v1::Plan kept = *MakePlan(s, 4);
  EXPECT_EQ(kept.memory_per_rank().params_bytes(), 4 * kept.num_params());
  EXPECT_EQ(resharded.memory_per_rank().params_bytes(), 4 * kept.num_params() / 4);
  EXPECT_LT(kept.comm_bytes_per_step(), resharded.comm_bytes_per_step());
}

// ----------------------------------------------------------------------------
// Impossible layouts.

std::string Error(const JobSpec& s, int world) {
  absl::StatusOr<v1::Plan> p = MakePlan(s, world);
  EXPECT_FALSE(p.ok());
  if (p.ok()) return "";
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

TEST(PlanErrorsTest, WorldMismatchNamesEveryFactor) {
  JobSpec s = SmallSpec(2, 1, 3);
  s.batch.global = 4;
  EXPECT_EQ(Error(s, 4), "dp·tp·pp = 2·1·3 = 6 ≠ world 4");
  EXPECT_NE(Error(s, 0).find("world: 0 must be >= 1"), std::string::npos);
}

TEST(PlanErrorsTest, HeadsNotDivisibleByTp) {
  JobSpec s = SmallSpec(1, 3, 1);
  s.model.heads = 4;
  EXPECT_EQ(Error(s, 3), "model.heads: 4 is not divisible by parallel.tp: 3");
}

TEST(PlanErrorsTest, FewerLayersThanStages) {
  JobSpec s = SmallSpec(1, 1, 3);
  s.model.layers = 2;
  EXPECT_EQ(Error(s, 3), "model.layers: 2 < parallel.pp: 3");
}

TEST(PlanErrorsTest, GlobalBatchNotDivisible) {
  JobSpec s = SmallSpec(4, 1, 1);
  s.batch = {30, 8, 16};
  EXPECT_EQ(Error(s, 4),
            "batch.global: 30 is not a positive multiple of batch.micro·parallel.dp = 8·4 = 32");
}

TEST(PlanErrorsTest, EveryProblemIsReported) {
  JobSpec s = SmallSpec(2, 3, 3);
  s.model.heads = 4;
  s.model.dim = 8;
  s.model.layers = 2;
  s.batch = {6, 2, 32};  // seq_len > context 16 too
  const std::string e = Error(s, 4);
  for (const char* part :
       {"dp·tp·pp = 2·3·3 = 18 ≠ world 4", "model.heads: 4 is not divisible by parallel.tp: 3",
        "model.layers: 2 < parallel.pp: 3", "batch.seq_len: 32 > model.context: 16",
        "batch.global: 6 is not a positive multiple of batch.micro·parallel.dp"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << "\nin: " << e;
  }
}

TEST(PlanErrorsTest, BadFactorsAndModel) {
  JobSpec s = SmallSpec(0, 1, 1);
  EXPECT_NE(Error(s, 1).find("parallel.dp: 0 must be >= 1"), std::string::npos);
  s = SmallSpec(1, 1, 1);
  s.parallel.zero = 4;
  EXPECT_NE(Error(s, 1).find("parallel.zero: 4"), std::string::npos);
  s = SmallSpec(1, 1, 1);
  s.model.dim = 100;  // not divisible by 12 heads
  EXPECT_NE(Error(s, 1).find("model.dim"), std::string::npos);
}

// ----------------------------------------------------------------------------
// Examples and text.

JobSpec Example(const std::string& name) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(ReadFile(kSourceDir + "/examples/" + name));
  EXPECT_TRUE(s.ok()) << name << ": " << s.status();
  return s.ok() ? *s : JobSpec();
}

TEST(PlanExamplesTest, EveryExamplePlansAtItsWorld) {
  for (const char* name : {"fortunes-tiny.yaml", "fortunes-ddp.yaml", "gpt2-124m-zero3.yaml"}) {
    const JobSpec s = Example(name);
    absl::StatusOr<v1::Plan> p = MakePlan(s, s.World());
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ(p->world(), s.World());
    EXPECT_FALSE(PlanText(s, *p).empty());
  }
}

TEST(PlanTextTest, FortunesDdp) {
  const JobSpec s = Example("fortunes-ddp.yaml");
  const v1::Plan p = *MakePlan(s, 4);
  const std::string text = PlanText(s, p);
  for (const char* part :
       {"world 4 = dp 4 · tp 1 · pp 1", "ZeRO-0", "global 32 = micro 8 × dp 4 × accumulation 1",
        "bubble 0.0%", "RANK  DP  TP  PP  SAMPLES", "   3   3   0   0  [24, 32)",
        "STAGE  BYTES/PARAM", "*0          16.000", " 3           4.000", "comm per step",
        "block.3", "dp3 [", "final"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  EXPECT_EQ(text.find("..."), std::string::npos) << text;  // 6 units: all shown
}

TEST(PlanTextTest, Gpt2ElidesMiddleUnits) {
  const JobSpec s = Example("gpt2-124m-zero3.yaml");
  const v1::Plan p = *MakePlan(s, 8);
  const std::string text = PlanText(s, p);
  for (const char* part :
       {"world 8 = dp 8 · tp 1 · pp 1", "ZeRO-3", "precision bf16", "embeddings", "block.0",
        "... 10 more units ...", "block.11", "final", "*3", "dp7 ["}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  EXPECT_EQ(text.find("block.5"), std::string::npos) << text;
}

}  // namespace
}  // namespace shardtrain
