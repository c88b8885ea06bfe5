// The planner over every mesh up to world 16 (coordinates, groups, shards,
// stages, bubble, memory and comm against an independent reference), and the
// layouts it refuses. Memory figures and examples: planner_memory_test.cc.
#include "tests/unit/common/planner_test_util.h"

namespace shardtrain {
namespace {

// ----------------------------------------------------------------------------
// Reference model of memory and communication, written from the formulas in
// planner.h independently of planner.cc: per stage, the units of its slice
// (SliceUnits: blocks of the stage split over tp, embeddings on the first and
// last, final on the last), each sharded per unit over dp by the ZeRO stage.

struct Reference {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, comm_buffer = 0, working = 0,
          total = 0;
  int64_t comm = 0, tp_comm = 0, pp_comm = 0, dp_comm = 0, num_params = 0;
};

Reference ReferenceFor(const JobSpec& s, const v1::Plan& plan, int stage) {
  const int dp = s.parallel.dp, tp = s.parallel.tp, pp = s.parallel.pp, zero = s.parallel.zero;
  const int m = s.Split()->accum;
  const bool mixed = s.precision != Precision::kFp32;
  // Gradients are fp32 whatever the precision (every engine accumulates them
  // in fp32); parameters and activations take the compute type.
  const int64_t pb = mixed ? 2 : 4, ob = mixed ? 12 : 8, ab = pb, gb = 4;
  const v1::PipelineStage& st = plan.stages(stage);
  const bool first = stage == 0, last = stage == pp - 1;
  Reference r;
  // The units in forward order, with sizes; the last dp rank's share.
  std::vector<int64_t> fwd;
  int64_t emb = 0, shard_sum = 0, largest_block = 0, local = 0;
  int64_t sent_params = 0, sent_grads_rs = 0, sent_grads_ar = 0;  // one pass each
  const model::ModelSlice slice{st.first_layer(), st.num_layers(), first, last, tp};
  for (const auto& [name, n] : SliceUnits(s, slice)) {
    if (name == "embeddings") {
      emb = n;
    } else if (name != "final") {
      largest_block = std::max(largest_block, n);
    }
    fwd.push_back(n);
    const int64_t body = n / dp, rem = n % dp, shard = body + rem;
    r.params += pb * (zero == 3 ? shard : n);
    r.grads += gb * (zero >= 2 ? shard : n);
    r.optimizer += ob * (zero >= 1 ? shard : n);
    shard_sum += shard;
    local += n;
    // Ring model: all-gather body (dp-1)·S, tail broadcast (dp-1)/dp·R;
    // reduce-scatter body (dp-1)·S, tail all-reduce 2(dp-1)/dp·R.
    sent_params += (dp - 1) * body * pb + (rem ? (dp - 1) * rem * pb / dp : 0);
    sent_grads_rs += (dp - 1) * body * gb + (rem ? 2 * (dp - 1) * rem * gb / dp : 0);
    sent_grads_ar += 2 * (dp - 1) * n * gb / dp;
  }
  const model::ActivationTable acts =
      ActivationsOf(s, {st.first_layer(), st.num_layers(), first, last, tp});
  int64_t alive = 1;
  if (pp > 1) {
    alive = s.parallel.schedule == PipelineSchedule::kGpipe ? m : std::min<int64_t>(pp - stage, m);
  }
  r.activations = acts.bytes(alive);
  if (dp > 1) {
    // A shard to receive reduce-scatters into when accumulating; on CPU the
    // Gloo backend's fp32 scratch: all-reduce one block (+1) of its largest
    // op (DDP's bucket, ZeRO-1's largest unit), reduce-scatter three blocks.
    if (zero >= 2 && m > 1) r.comm_buffer += shard_sum * gb;
    const int64_t largest = *std::max_element(fwd.begin(), fwd.end());
    const int64_t bucket = std::min<int64_t>(int64_t{s.parallel.bucket_mb} << 18, local);
    if (zero == 0) r.comm_buffer += 4 * (bucket / dp + 1);
    if (zero == 1) r.comm_buffer += 4 * (largest / dp + 1);
    if (zero >= 2) r.comm_buffer += 4 * 3 * (largest / dp);
  }
  if (zero >= 2) r.working = gb * (emb + (dp > 1 ? 2 : 1) * largest_block);
  if (zero == 3) {
    // Two units at once: neighbours in forward order, and the turn from the
    // end of the forward back to the LM head (last unit, embeddings).
    int64_t gathered = fwd.size() == 1 ? fwd[0] : 0;
    for (size_t i = 0; i + 1 < fwd.size(); ++i) gathered = std::max(gathered, fwd[i] + fwd[i + 1]);
    if (emb > 0) gathered = std::max(gathered, fwd.back() + emb);
    // A gathered unit in the compute type, and under mixed precision its
    // fp32 master too (the compute copy is refreshed from it).
    r.working += (mixed ? pb + 4 : pb) * (s.parallel.reshard_after_forward ? gathered : local);
  }
  r.total = r.params + r.grads + r.optimizer + r.activations + r.comm_buffer + r.working;

  if (dp > 1) {
    if (zero == 0) r.comm += 2 * (dp - 1) * local * gb / dp;  // DDP: one all-reduce
    if (zero == 1) r.comm += sent_grads_ar + sent_params;
    if (zero == 2) r.comm += m * sent_grads_rs + sent_params;
    if (zero == 3) {
      r.comm += m * (sent_grads_rs + (s.parallel.reshard_after_forward ? 2 : 1) * sent_params);
    }
    if (zero >= 1) r.comm += (dp - 1) * 8;  // the gradient norm's all-gather
  }
  r.dp_comm = r.comm;
  // tp: per micro-batch 4 all-reduces of B·T·C per layer, one more on the
  // first stage (embedding) and on the last (LM head input gradient), and 3
  // of B·T fp32 on the last (cross-entropy); each sends 2(tp-1)/tp of it.
  const int64_t L = st.num_layers(), BT = int64_t{s.batch.micro} * s.batch.seq_len,
                BTC = BT * s.model.dim;
  if (tp > 1) {
    const int64_t reduces = 4 * L + first + last;
    r.tp_comm = m * (reduces * (2 * (tp - 1) * BTC * ab / tp) +
                     (last ? 3 * (2 * (tp - 1) * BT * 4 / tp) : 0));
  }
  // pp: B·T·C each way per boundary and micro-batch; the tied wte gradient
  // (Vp/tp rows) summed between the end stages once per step.
  r.pp_comm = m * ((last ? 0 : 1) + (first ? 0 : 1)) * BTC * ab;
  if (pp > 1 && (first || last)) {
    r.pp_comm += model::PaddedVocab(s.model.vocab) * s.model.dim / tp * gb;
  }
  r.comm += r.tp_comm + r.pp_comm;
  r.num_params = local;
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
    ASSERT_EQ(u.shard_offsets_size(), dp);
    ASSERT_EQ(u.shard_sizes_size(), dp);
    int64_t expect_offset = 0, sum = 0;
    for (int d = 0; d < dp; ++d) {
      EXPECT_EQ(u.shard_offsets(d), expect_offset) << "dp rank " << d;  // contiguous, disjoint
      // floor(numel/dp) each; the last rank also the remainder (< dp).
      EXPECT_EQ(u.shard_sizes(d), u.numel() / dp + (d == dp - 1 ? u.numel() % dp : 0))
          << "dp rank " << d;
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

TEST_P(PlanMeshTest, StagesAreTheBalancedSplitOrTheJobs) {
  JobSpec s = SmallSpec(dp(), tp(), pp());
  const model::ModelConfig cfg = *model::MakeGptConfig(5, 12, 96, 16, 150);
  // The balanced split, then an explicit one: the last stage takes the rest.
  std::vector<int> explicit_split(pp(), 1);
  explicit_split.back() = 5 - (pp() - 1);
  for (const std::vector<int>& requested : {std::vector<int>{}, explicit_split}) {
    s.parallel.stages = requested;
    const v1::Plan p = Plan(s);
    const std::vector<int> want = *model::StageLayers(cfg, pp(), requested);
    ASSERT_EQ(p.stages_size(), pp());
    int next = 0;
    for (int st = 0; st < pp(); ++st) {
      const v1::PipelineStage& ps = p.stages(st);
      EXPECT_EQ(ps.stage(), st);
      EXPECT_EQ(ps.first_layer(), next);
      EXPECT_EQ(ps.num_layers(), want[st]) << "stage " << st;
      next += ps.num_layers();
      // The rank's slice: SliceUnits' formula, which is also ParamLayout's count.
      int64_t n = 0;
      const model::ModelSlice slice{ps.first_layer(), ps.num_layers(), st == 0, st == pp() - 1,
                                    tp()};
      for (const auto& unit : SliceUnits(s, slice)) n += unit.second;
      EXPECT_EQ(ps.num_params(), n) << "stage " << st;
      EXPECT_EQ(ps.num_params(), static_cast<int64_t>(model::ParamLayout(cfg, slice).num_params()));
    }
    EXPECT_EQ(next, 5);
  }
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
      for (int zero = 0; zero <= (pp() == 1 ? 3 : 2); ++zero) {
        JobSpec s = SmallSpec(dp(), tp(), pp());
        s.precision = prec;
        s.parallel.schedule = sched;
        s.parallel.zero = zero;
        SCOPED_TRACE(testing::Message() << "zero " << zero << " precision " << EnumName(prec)
                                        << " schedule " << EnumName(sched));
        const v1::Plan p = Plan(s);
        // The busiest stage, by total memory (first on ties) and by bytes sent.
        Reference want, want_comm;
        for (int st = 0; st < pp(); ++st) {
          Reference r = ReferenceFor(s, p, st);
          if (st == 0 || r.total > want.total) want = r;
          if (st == 0 || r.comm > want_comm.comm) want_comm = r;
          // Each stage's own figures.
          const v1::PipelineStage& ps = p.stages(st);
          EXPECT_EQ(ps.memory().total_bytes(), r.total) << "stage " << st;
          EXPECT_EQ(ps.memory().activations_bytes(), r.activations) << "stage " << st;
          EXPECT_EQ(ps.tp_comm_bytes(), r.tp_comm) << "stage " << st;
          EXPECT_EQ(ps.pp_comm_bytes(), r.pp_comm) << "stage " << st;
          EXPECT_EQ(ps.dp_comm_bytes(), r.dp_comm) << "stage " << st;
          EXPECT_EQ(ps.num_params(), r.num_params) << "stage " << st;
        }
        const v1::MemoryEstimate& got = p.memory_per_rank();
        EXPECT_EQ(got.params_bytes(), want.params);
        EXPECT_EQ(got.grads_bytes(), want.grads);
        EXPECT_EQ(got.optimizer_bytes(), want.optimizer);
        EXPECT_EQ(got.activations_bytes(), want.activations);
        EXPECT_EQ(got.comm_buffer_bytes(), want.comm_buffer);
        EXPECT_EQ(got.working_bytes(), want.working);
        EXPECT_EQ(got.total_bytes(), want.total);
        EXPECT_EQ(p.comm_bytes_per_step(), want_comm.comm);
        EXPECT_EQ(p.tp_comm_bytes_per_step(), want_comm.tp_comm);
        EXPECT_EQ(p.pp_comm_bytes_per_step(), want_comm.pp_comm);
        EXPECT_EQ(p.dp_comm_bytes_per_step(), want_comm.dp_comm);
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
    s.model = {"", /*layers=*/2, /*heads=*/1, /*dim=*/5, /*context=*/3, /*vocab=*/7, /*init=*/""};
    s.batch = {/*global=*/dp, /*micro=*/1, /*seq_len=*/3};
    absl::StatusOr<v1::Plan> p = MakePlan(s, dp);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectShardsPartitionUnits(*p, LayoutOf(s), dp);
  }
  // One exact case: final (10 elements) over 16 ranks: 15 empty shards, the
  // last rank holds all 10.
  JobSpec s = SmallSpec(16, 1, 1);
  s.model = {"", 2, 1, 5, 3, 7, ""};
  s.batch = {16, 1, 3};
  const v1::ShardUnit u = MakePlan(s, 16)->units(3);
  ASSERT_EQ(u.name(), "final");
  for (int d = 0; d < 16; ++d) {
    EXPECT_EQ(u.shard_sizes(d), d < 15 ? 0 : 10);
    EXPECT_EQ(u.shard_offsets(d), 0);
  }
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
  EXPECT_EQ(Error(s, 4), "parallel.dp × parallel.tp × parallel.pp = 2 × 1 × 3 = 6 ≠ world 4");
  EXPECT_NE(Error(s, 0).find("world: 0 must be >= 1"), std::string::npos);
}

TEST(PlanErrorsTest, HeadsNotDivisibleByTp) {
  JobSpec s = SmallSpec(1, 3, 1);
  s.model.heads = 4;
  EXPECT_EQ(Error(s, 3), "parallel.tp: 3 does not divide model.heads: 4");
}

TEST(PlanErrorsTest, PaddedVocabNotDivisibleByTp) {
  JobSpec s = SmallSpec(1, 3, 1);
  s.model.vocab = 100;  // Vp 128
  EXPECT_EQ(Error(s, 3),
            "parallel.tp: 3 does not divide the padded vocabulary 128 (model.vocab 100 rounded up "
            "to a multiple of 64)");
}

TEST(PlanErrorsTest, BadStages) {
  JobSpec s = SmallSpec(1, 1, 2);
  s.parallel.stages = {2, 2};
  EXPECT_EQ(Error(s, 2), "parallel.stages: layers sum to 4, expected model.layers: 5");
  s.parallel.stages = {5};
  EXPECT_EQ(Error(s, 2),
            "parallel.stages: has 1 entries, expected one per pipeline stage (parallel.pp: 2)");
}

TEST(PlanErrorsTest, ZeroThreeWithAPipeline) {
  JobSpec s = SmallSpec(2, 1, 2);
  s.parallel.zero = 3;
  EXPECT_EQ(Error(s, 4).rfind("parallel.zero: 3 cannot be combined with parallel.pp: 2 (", 0), 0u)
      << Error(s, 4);
  s.parallel.zero = 2;
  EXPECT_TRUE(MakePlan(s, 4).ok());
}

TEST(PlanErrorsTest, FewerLayersThanStages) {
  JobSpec s = SmallSpec(1, 1, 3);
  s.model.layers = 2;
  EXPECT_EQ(Error(s, 3), "parallel.pp: 3 exceeds model.layers: 2");
}

TEST(PlanErrorsTest, GlobalBatchNotDivisible) {
  JobSpec s = SmallSpec(4, 1, 1);
  s.batch = {30, 8, 16};
  EXPECT_EQ(Error(s, 4),
            "batch.global: 30 is not divisible by batch.micro × parallel.dp = 8 × 4 = 32 (global = "
            "micro × dp × gradient accumulation steps)");
}

TEST(PlanErrorsTest, EveryProblemIsReported) {
  JobSpec s = SmallSpec(2, 3, 3);
  s.model.heads = 4;
  s.model.dim = 8;
  s.model.layers = 2;
  s.batch = {6, 2, 32};  // seq_len > context 16 too
  const std::string e = Error(s, 4);
  for (const char* part :
       {"parallel.dp × parallel.tp × parallel.pp = 2 × 3 × 3 = 18 ≠ world 4",
        "parallel.tp: 3 does not divide model.heads: 4", "parallel.pp: 3 exceeds model.layers: 2",
        "batch.seq_len: 32 exceeds model.context: 16",
        "batch.global: 6 is not divisible by batch.micro × parallel.dp"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << "\nin: " << e;
  }
}

TEST(PlanErrorsTest, BadFactorsAndModel) {
  JobSpec s = SmallSpec(0, 1, 1);
  EXPECT_NE(Error(s, 1).find("parallel.dp: must be >= 1, got 0"), std::string::npos);
  s = SmallSpec(1, 1, 1);
  s.parallel.zero = 4;
  EXPECT_NE(Error(s, 1).find("parallel.zero: 4"), std::string::npos);
  s = SmallSpec(1, 1, 1);
  s.model.dim = 100;  // not divisible by 12 heads
  EXPECT_NE(Error(s, 1).find("model.dim"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain
