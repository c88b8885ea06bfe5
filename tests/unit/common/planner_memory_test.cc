// The planner's memory and communication model against the ZeRO paper and
// hand computations, and the plans and text of the shipped examples.
#include "tests/unit/common/planner_test_util.h"

namespace shardtrain {
namespace {

// ----------------------------------------------------------------------------
// Memory, by hand and against the ZeRO paper.

// The brief's formulas written out for tp = pp = 1, using the plan's own
// shard ranges: sharded parts hold the last dp rank's share of every unit
// (floor(numel/dp) plus numel mod dp), the busiest rank.
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
          n_shard += u.shard_sizes(dp - 1);
        }
        ASSERT_EQ(n, p.num_params());
        // The engines' bytes: mixed keeps a 2-byte compute copy, fp32
        // gradients and the fp32 master + m + v.
        const int64_t pb = mixed ? 2 : 4, gb = 4, ob = mixed ? 12 : 8;
        const v1::MemoryEstimate& mem = p.memory_per_rank();
        EXPECT_EQ(mem.params_bytes(), pb * (zero >= 3 ? n_shard : n));
        EXPECT_EQ(mem.grads_bytes(), gb * (zero >= 2 ? n_shard : n));
        EXPECT_EQ(mem.optimizer_bytes(), ob * (zero >= 1 ? n_shard : n));
        // Same thing through the exported helper, unit by unit.
        int64_t helper = 0;
        for (const v1::ShardUnit& u : p.units()) {
          helper += ZeroMemoryBytes(u.numel(), dp, zero, EngineStateBytes(s.precision)).Total();
        }
        EXPECT_EQ(mem.params_bytes() + mem.grads_bytes() + mem.optimizer_bytes(), helper);

        // Activations: the engine's table for one micro-batch, whole model.
        EXPECT_EQ(mem.activations_bytes(), ActivationsOf(s).bytes(1));
        // Collectives run in place; without accumulation the only buffers
        // are the Gloo backend's fp32 scratch (CPU): all-reduce one block
        // (+1) of the whole gradient (< 25 MiB, one bucket) or of the
        // largest unit, reduce-scatter three blocks of the largest unit.
        const int64_t largest = p.units(1).numel();
        int64_t comm_buffer = 0;
        if (dp > 1 && zero == 0) comm_buffer = 4 * (n / dp + 1);
        if (dp > 1 && zero == 1) comm_buffer = 4 * (largest / dp + 1);
        if (dp > 1 && zero >= 2) comm_buffer = 4 * 3 * (largest / dp);
        EXPECT_EQ(mem.comm_buffer_bytes(), comm_buffer);
        // Working set: ZeRO-2/3 full-unit gradients (embeddings + the block
        // computing + the one being reduced), ZeRO-3 also two gathered units
        // (mixed: each unit's fp32 master beside its compute copy).
        const int64_t emb = p.units(0).numel(), blk = p.units(1).numel();
        ASSERT_GT(blk, emb);  // a block: 12C² + 13C > (Vp + context)·C here
        int64_t working = 0;
        if (zero >= 2) working += gb * (emb + (dp > 1 ? 2 : 1) * blk);
        if (zero == 3) working += (mixed ? pb + 4 : pb) * 2 * blk;
        EXPECT_EQ(mem.working_bytes(), working);
        EXPECT_EQ(mem.host_bytes(), 0);
        EXPECT_EQ(mem.total_bytes(), mem.params_bytes() + mem.grads_bytes() +
                                         mem.optimizer_bytes() + mem.activations_bytes() +
                                         mem.comm_buffer_bytes() + mem.working_bytes());

        // Bytes sent per step (m = 1), per unit of n = dp·S + R elements
        // (gradients in gb bytes, gathered parameters in pb):
        // all-gather (dp-1)·S (+ broadcast of the tail (dp-1)/dp·R),
        // reduce-scatter (dp-1)·S (+ all-reduce of the tail 2(dp-1)/dp·R),
        // all-reduce 2(dp-1)/dp·n; ZeRO 1-3 also all-gather the norm (8 B).
        int64_t want = 0;
        for (const v1::ShardUnit& u : p.units()) {
          const int64_t S = u.numel() / dp, R = u.numel() % dp, f = dp - 1;
          const int64_t gather = f * S * pb + (R ? f * R * pb / dp : 0);
          const int64_t scatter = f * S * gb + (R ? 2 * f * R * gb / dp : 0);
          if (zero == 1) want += 2 * f * u.numel() * gb / dp + gather;
          if (zero == 2) want += scatter + gather;
          if (zero == 3) want += scatter + 2 * gather;
        }
        if (zero == 0) want = 2 * (dp - 1) * n * gb / dp;
        if (zero >= 1) want += (dp - 1) * 8;
        EXPECT_EQ(p.comm_bytes_per_step(), want);
      }
    }
  }
}

TEST(PlanMemoryTest, FortunesDdpByHand) {
  // L=4 NH=4 C=128 context=128 V=Vp=256, dp 4, fp32, ZeRO-0, micro 8, T 64.
  JobSpec s = SmallSpec(4, 1, 1);
  s.model = {"", 4, 4, 128, 128, 256, ""};
  s.batch = {32, 8, 64};
  const v1::Plan p = *MakePlan(s, 4);
  // embeddings (256+128)·128 = 49152; block 12·128² + 13·128 = 198272; final 256.
  const int64_t n = 49152 + 4 * 198272 + 256;
  EXPECT_EQ(p.num_params(), n);
  EXPECT_EQ(p.memory_per_rank().params_bytes(), 4 * n);
  EXPECT_EQ(p.memory_per_rank().grads_bytes(), 4 * n);
  EXPECT_EQ(p.memory_per_rank().optimizer_bytes(), 8 * n);
  EXPECT_EQ(p.memory_per_rank().activations_bytes(), ActivationsOf(s).bytes(1));
  EXPECT_EQ(p.comm_bytes_per_step(), 2 * 3 * n);  // all-reduce: 2·(3/4)·4n bytes, n % 4 == 0
}

// ZeRO paper, Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12):
// 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device for baseline, P_os, P_os+g, P_os+g+p.
TEST(PlanMemoryTest, ZeroPaperExample) {
  const int64_t psi = 7'500'000'000;
  const double paper_gb[4] = {120, 31.4, 16.6, 1.9};
  const double exact_gb[4] = {120, 30 + 90.0 / 64, 15 + 105.0 / 64, 120.0 / 64};
  for (int stage = 0; stage <= 3; ++stage) {
    const double gb = ZeroMemoryBytes(psi, 64, stage, kZeroPaperMixed).Total() / 1e9;
    EXPECT_NEAR(gb, exact_gb[stage], 1e-6) << "stage " << stage;
    // The paper prints one decimal: agree to that rounding (1.875 -> 1.9).
    EXPECT_NEAR(gb, paper_gb[stage], 0.05 + 1e-9) << "stage " << stage;
    if (stage < 3) {
      EXPECT_NEAR(gb / paper_gb[stage], 1.0, 0.01) << "stage " << stage;
    }
  }
  const ModelStateBytes z2 = ZeroMemoryBytes(psi, 64, 2, kZeroPaperMixed);
  EXPECT_EQ(z2.params, 2 * psi);
  EXPECT_EQ(z2.grads, 2 * (psi / 64));  // 64 divides 7.5e9
  EXPECT_EQ(z2.optimizer, 12 * (psi / 64));
  const ModelStateBytes fp32 = ZeroMemoryBytes(1000, 3, 0, EngineStateBytes(Precision::kFp32));
  EXPECT_EQ(fp32.Total(), 16 * 1000);
  EXPECT_EQ(ZeroMemoryBytes(1000, 3, 3, EngineStateBytes(Precision::kFp32)).Total(),
            16 * 334);  // 333 + remainder 1
  EXPECT_EQ(ZeroMemoryBytes(10, 4, 3, EngineStateBytes(Precision::kFp32)).Total(),
            16 * 4);  // 2 + remainder 2
}

// The same through MakePlan: a ~7.5B-parameter custom GPT (L=36, C=4096) on
// 64 data-parallel ranks; bytes/param of model state per rank follows the
// paper's model within 1% with the engines' bytes: the paper's 16,
// 4 + 12/64, 2 + 14/64, 16/64 count fp16 gradients, ours are fp32 (2 bytes
// more per element, sharded from ZeRO-2 on): 18, 6 + 12/64, 2 + 16/64, 18/64.
TEST(PlanMemoryTest, ZeroPaperExampleThroughMakePlan) {
  JobSpec s = SmallSpec(64, 1, 1);
  s.model = {"", 36, 32, 4096, 2048, 50257, ""};
  s.batch = {64, 1, 1024};
  s.precision = Precision::kBf16;
  const double want[4] = {18, 6 + 12.0 / 64, 2 + 16.0 / 64, 18.0 / 64};
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
  // The engine's table for each stage's two layers: saved tensors per
  // micro-batch, scratch once.
  const model::ActivationTable first = ActivationsOf(s, {0, 2, true, false, 1});
  const model::ActivationTable last = ActivationsOf(s, {2, 2, false, true, 1});
  ASSERT_EQ(first.scratch_bytes(), last.scratch_bytes());
  const int64_t scratch = first.scratch_bytes();
  // GPipe: stage 1 (logits) keeps 8 micro-batches; 1F1B: stage 0 keeps 2, stage 1 keeps 1.
  const int64_t last_mb = last.saved_bytes();
  const int64_t first_mb = first.saved_bytes();
  EXPECT_EQ(gpipe.memory_per_rank().activations_bytes(), 8 * last_mb + scratch);
  const int64_t stage0 = 4 * 4 * (emb + 2 * blk) + 2 * first_mb + scratch;
  const int64_t stage1 = 4 * 4 * (emb + 2 * blk + fin) + last_mb + scratch;
  EXPECT_EQ(one.memory_per_rank().total_bytes(), std::max(stage0, stage1));
  EXPECT_EQ(one.memory_per_rank().params_bytes(),
            4 * (stage0 >= stage1 ? emb + 2 * blk : emb + 2 * blk + fin));
  EXPECT_EQ(gpipe.memory_per_rank().params_bytes(), 4 * (emb + 2 * blk + fin));
}

TEST(PlanMemoryTest, AccumulationAddsAShardBufferToZero2And3) {
  JobSpec s = SmallSpec(2, 1, 1);  // global 48 = micro 2 × dp 2 × 12 micro-batches
  ASSERT_GT(s.Split()->accum, 1);
  for (DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    s.resources.device = device;
    for (int zero = 0; zero <= 3; ++zero) {
      SCOPED_TRACE(testing::Message() << EnumName(device) << " zero " << zero);
      s.parallel.zero = zero;
      const v1::Plan p = *MakePlan(s, 2);
      JobSpec one = s;
      one.batch.global = 4;  // one micro-batch per step
      const v1::Plan q = *MakePlan(one, 2);
      int64_t shard = 0;
      for (const v1::ShardUnit& u : p.units()) shard += u.shard_sizes(1);
      // ZeRO-2/3 receive each micro-batch's reduce-scatter into a
      // shard-sized buffer before adding it; everything else runs in place.
      // On GPU ranks ZeRO runs through the host: the buffer is the host's.
      const int64_t buffer = zero >= 2 ? 4 * shard : 0;
      const bool host = device == DeviceKind::kCuda && zero >= 1;
      EXPECT_EQ(p.memory_per_rank().comm_buffer_bytes() - q.memory_per_rank().comm_buffer_bytes(),
                host ? 0 : buffer);
      EXPECT_EQ(p.memory_per_rank().host_bytes() - q.memory_per_rank().host_bytes(),
                host ? buffer : 0);
    }
  }
}

TEST(PlanMemoryTest, OffloadMovesTheOptimizerStateToHostMemory) {
  JobSpec s = SmallSpec(4, 1, 1);
  s.parallel.zero = 3;
  const v1::Plan on_device = *MakePlan(s, 4);
  s.parallel.offload = OffloadMode::kOptimizer;
  const v1::Plan offloaded = *MakePlan(s, 4);
  const v1::MemoryEstimate &a = on_device.memory_per_rank(), &b = offloaded.memory_per_rank();
  EXPECT_EQ(b.optimizer_bytes(), a.optimizer_bytes());
  EXPECT_EQ(b.host_bytes(), a.optimizer_bytes());
  EXPECT_EQ(b.total_bytes(), a.total_bytes() - a.optimizer_bytes());
  EXPECT_NE(PlanText(s, offloaded).find("host memory"), std::string::npos);
}

// GPU ranks run ZeRO and the offloaded optimizer through the host
// (parallel::Zero's and Ddp's host paths): in bf16 the device keeps, up to
// ZeRO-2, the compute copy (2 bytes per element) and the fp32 master (4),
// under ZeRO-0/1 the gradients (4), and ZeRO-2/3's units in use (ZeRO-3: a
// gathered unit's master and compute copy, 6 bytes per element); the host m
// and v of the shard, fp32 copies of the whole parameters and gradients, and
// the shards.
TEST(PlanMemoryTest, GpuRanksKeepUnitsInUseOnTheDeviceAndTheShardsOnTheHost) {
  int64_t working[4] = {};
  for (int zero = 0; zero <= 3; ++zero) {
    SCOPED_TRACE(testing::Message() << "zero " << zero);
    JobSpec s = SmallSpec(4, 1, 1);
    s.batch.global = 8;  // m = 1: no accumulation buffer
    s.precision = Precision::kBf16;
    s.resources.device = DeviceKind::kCuda;
    s.parallel.zero = zero;
    if (zero == 0) s.parallel.offload = OffloadMode::kOptimizer;
    ASSERT_TRUE(StateThroughHost(s));
    const v1::Plan p = *MakePlan(s, 4);
    int64_t n = 0, shard = 0;
    for (const v1::ShardUnit& u : p.units()) {
      n += u.numel();
      shard += zero == 0 ? u.numel() : u.shard_sizes(3);
    }
    const v1::MemoryEstimate& mem = p.memory_per_rank();
    EXPECT_EQ(mem.params_bytes(), zero < 3 ? (2 + 4) * n : 0);
    EXPECT_EQ(mem.grads_bytes(), zero < 2 ? 4 * n : 0);
    EXPECT_EQ(mem.optimizer_bytes(), 8 * shard);
    working[zero] = mem.working_bytes();
    EXPECT_EQ(mem.host_bytes(),
              8 * shard + 8 * n + (zero >= 2 ? 4 * shard : 0) + (zero == 3 ? 4 * shard : 0));
    EXPECT_EQ(mem.total_bytes(), mem.params_bytes() + mem.grads_bytes() + mem.activations_bytes() +
                                     mem.comm_buffer_bytes() + mem.working_bytes());
    EXPECT_NE(PlanText(s, p).find("GPU ranks: through the host"), std::string::npos);
  }
  // ZeRO-2's working set: the embeddings' gradient and one block's; ZeRO-3
  // adds the gathered units, 6 bytes per element. None below.
  EXPECT_EQ(working[0], 0);
  EXPECT_EQ(working[1], 0);
  EXPECT_GT(working[2], 0);
  JobSpec peak = SmallSpec(4, 1, 1);
  peak.batch.global = 8;  // fp32 on CPU: 4 bytes per gathered element
  int64_t cpu_working[4] = {};
  for (int zero : {2, 3}) {
    peak.parallel.zero = zero;
    cpu_working[zero] = MakePlan(peak, 4)->memory_per_rank().working_bytes();
  }
  const int64_t gathered_fp32 = cpu_working[3] - cpu_working[2];
  EXPECT_GT(gathered_fp32, 0);
  EXPECT_EQ((working[3] - working[2]) * 4, gathered_fp32 * 6);
  // CPU ranks, and GPU DDP without offload, are planned as before.
  JobSpec s = SmallSpec(4, 1, 1);
  s.resources.device = DeviceKind::kCuda;
  EXPECT_FALSE(StateThroughHost(s));
  s.resources.device = DeviceKind::kCpu;
  s.parallel.zero = 3;
  EXPECT_FALSE(StateThroughHost(s));
  // Over NCCL, ZeRO keeps its shards on the GPUs; DDP's offloaded optimizer
  // steps a host copy as over Gloo, planned the same (the plan says how).
  s.resources.device = DeviceKind::kCuda;
  s.parallel.comm = CommBackend::kNccl;
  EXPECT_FALSE(StateThroughHost(s));
  s.parallel.zero = 0;
  s.parallel.offload = OffloadMode::kOptimizer;
  EXPECT_TRUE(StateThroughHost(s));
  const v1::Plan nccl = *MakePlan(s, 4);
  s.parallel.comm = CommBackend::kGloo;
  const v1::Plan gloo = *MakePlan(s, 4);
  EXPECT_EQ(nccl.memory_per_rank().host_bytes(), gloo.memory_per_rank().host_bytes());
  EXPECT_EQ(nccl.memory_per_rank().params_bytes(), gloo.memory_per_rank().params_bytes());
  s.parallel.comm = CommBackend::kNccl;
  EXPECT_NE(PlanText(s, nccl).find("the optimizer through the host (NCCL reduces on the GPUs"),
            std::string::npos)
      << PlanText(s, nccl);
}

TEST(PlanMemoryTest, TensorParallelSplitsMatmulsAndVocabulary) {
  JobSpec s = SmallSpec(1, 4, 1);
  const v1::Plan p = *MakePlan(s, 4);
  // By hand, C = 96, Vp = 192, context 16, 5 layers, tp 4: wte 192·96/4,
  // wpe 16·96; per block 6·96 replicated + (12·96² + 7·96)/4; final 2·96.
  const int64_t want = 192 * 96 / 4 + 16 * 96 + 5 * (6 * 96 + (12 * 96 * 96 + 7 * 96) / 4) + 2 * 96;
  EXPECT_EQ(p.stages(0).num_params(), want);
  EXPECT_EQ(p.memory_per_rank().params_bytes(), 4 * want);
  // Less than a quarter of the whole model would be wrong: LayerNorms and wpe stay whole.
  EXPECT_GT(4 * want, p.num_params());
}

TEST(PlanMemoryTest, TensorAndPipelineCommByHand) {
  // tp 2, pp 2, fp32, 5 layers split {3, 2} or as balanced; m = 48 / 2 = 24.
  JobSpec s = SmallSpec(1, 2, 2);
  s.parallel.stages = {3, 2};
  const v1::Plan p = *MakePlan(s, 4);
  const int64_t m = 24, BT = 2 * 16, BTC = BT * 96, ar = 2 * (2 - 1) * BTC * 4 / 2;
  // Stage 0: 3 layers × 4 + the embedding's all-reduce; sends activations forward.
  EXPECT_EQ(p.stages(0).tp_comm_bytes(), m * (3 * 4 + 1) * ar);
  const int64_t wte_grad = 192 * 96 / 2 * 4;  // its tp half, summed with the last stage once
  EXPECT_EQ(p.stages(0).pp_comm_bytes(), m * BTC * 4 + wte_grad);
  // Stage 1: 2 layers × 4 + the LM head's input gradient + 3 cross-entropy
  // all-reduces of B·T fp32; sends gradients back.
  EXPECT_EQ(p.stages(1).tp_comm_bytes(), m * ((2 * 4 + 1) * ar + 3 * (BT * 4)));
  EXPECT_EQ(p.stages(1).pp_comm_bytes(), m * BTC * 4 + wte_grad);
  EXPECT_EQ(p.stages(0).dp_comm_bytes(), 0);
  // 1F1B: stage 0 keeps pp - 0 = 2 micro-batches, the last 1.
  EXPECT_EQ(p.stages(0).in_flight(), 2);
  EXPECT_EQ(p.stages(1).in_flight(), 1);
  const std::string text = PlanText(s, p);
  for (const char* part : {"STAGE  LAYERS  PARAMS/RANK  IN-FLIGHT", "0..2", "3..4", "= tp ",
                           "bubble (p-1)/(m+p-1) = 1/25 = 4.0%", "vocab-parallel cross-entropy",
                           "refused: ZeRO-3 needs pp = 1"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
}

// Interleaved 1F1B (parallel.pp_virtual 2) on pp 2, 4 layers: each stage two
// one-layer chunks (stage 0: layers 0 and 2; stage 1: 1 and 3), the bubble
// (p-1)/(v·m+p-1), each chunk's own peak of its sets from the schedule, and
// every chunk's activations sent but at the pipeline's two ends.
TEST(PlanMemoryTest, InterleavedStagesByHand) {
  JobSpec s = SmallSpec(1, 1, 2);
  s.model.layers = 4;
  s.parallel.pp_virtual = 2;
  s.batch.global = 8;  // m = 4
  const v1::Plan p = *MakePlan(s, 2);
  EXPECT_EQ(p.pp_virtual(), 2);
  EXPECT_DOUBLE_EQ(p.bubble_fraction(), 1.0 / (2 * 4 + 1));
  ASSERT_EQ(p.stages_size(), 2);
  const model::ModelConfig cfg = *model::MakeGptConfig(4, 12, 96, 16, 150);
  for (int st = 0; st < 2; ++st) {
    const v1::PipelineStage& ps = p.stages(st);
    EXPECT_EQ(ps.first_layer(), st);
    EXPECT_EQ(ps.num_layers(), 1);
    EXPECT_EQ(ps.chunks(), 2);
    EXPECT_EQ(ps.chunk_stride(), 2);
    const model::ModelSlice slice = model::SliceOf({1, 1, 1, 1}, st, 1, 0, 2);
    EXPECT_EQ(ps.num_params(), static_cast<int64_t>(model::ParamLayout(cfg, slice).num_params()));
    // Stage 0 holds 4 of chunk 0's micro-batches and 2 of chunk 1's at
    // once (pipeline_schedule_test); stage 1, whose chunk 1 ends the
    // pipeline (F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 ...), 3 and 1.
    const std::vector<int> sets = st == 0 ? std::vector<int>{4, 2} : std::vector<int>{3, 1};
    EXPECT_EQ(ps.in_flight(), sets[0] + sets[1]);
    EXPECT_EQ(ps.memory().activations_bytes(), ActivationsOf(s, slice).bytes(sets));
  }
  // Per micro-batch 3 of the 4 chunks send on (and 3 gradients come back):
  // each stage sends 3 of its 4 chunk exchanges, plus the tied wte gradient.
  const int64_t BTC = 2 * 16 * 96, wte_grad = 192 * 96 * 4;
  EXPECT_EQ(p.stages(0).pp_comm_bytes(), 4 * 3 * BTC * 4 + wte_grad);
  EXPECT_EQ(p.stages(1).pp_comm_bytes(), 4 * 3 * BTC * 4 + wte_grad);
  const std::string text = PlanText(s, p);
  for (const char* part :
       {"0..0,2..2", "1..1,3..3", "2 stages × 2 model chunks",
        "bubble (p-1)/(v·m+p-1) = 1/9 = 11.1% (1F1B: 20.0%)", "interleaved 1F1B keeps"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
}

TEST(PlanMemoryTest, ReshardAfterForwardFalseKeepsParams) {
  JobSpec s = SmallSpec(4, 1, 1);
  s.parallel.zero = 3;
  const v1::Plan resharded = *MakePlan(s, 4);
  s.parallel.reshard_after_forward = false;
  const v1::Plan kept = *MakePlan(s, 4);
  // The shard is kept either way; without resharding every unit is gathered
  // at the end of the forward (ZeRO-2's parameter memory), with it two.
  EXPECT_EQ(kept.memory_per_rank().params_bytes(), resharded.memory_per_rank().params_bytes());
  const int64_t grads_working = 4 * (kept.units(0).numel() + 2 * kept.units(1).numel());
  EXPECT_EQ(kept.memory_per_rank().working_bytes(), grads_working + 4 * kept.num_params());
  EXPECT_EQ(resharded.memory_per_rank().working_bytes(),
            grads_working + 4 * 2 * resharded.units(1).numel());
  EXPECT_LT(kept.comm_bytes_per_step(), resharded.comm_bytes_per_step());
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
        "STAGE  FORMULA B/PARAM  PLAN B/PARAM", "*0              16.000        16.000",
        " 3               4.000         4.000", "comm per step", "block.3", "dp3 [", "final"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  EXPECT_EQ(text.find("..."), std::string::npos) << text;  // 6 units: all shown
}

// What a checkpoint takes on disk: 12 bytes per parameter (fp32 params,
// AdamW m and v) and each shard file's header, in total and for the largest
// rank's shard; `plan` prints both and the volume a job with
// checkpoint.every needs.
TEST(PlanTextTest, CheckpointBytesInTotalAndPerRank) {
  JobSpec s = Example("fortunes-ddp.yaml");
  const v1::Plan ddp = *MakePlan(s, 4);
  const int64_t n = ddp.num_params();
  EXPECT_EQ(ddp.checkpoint_bytes(), 12 * n + 4 * ShardFileBytes(0, 1));
  EXPECT_EQ(ddp.checkpoint_bytes_per_rank(), ShardFileBytes((n + 3) / 4, 1));
  EXPECT_NE(PlanText(s, ddp).find(absl::StrCat(
                "\ncheckpoint: ", FormatPlanBytes(ddp.checkpoint_bytes()), " per checkpoint")),
            std::string::npos)
      << PlanText(s, ddp);
  EXPECT_NE(PlanText(s, ddp).find("checkpoint.every 0: only the final weights are saved"),
            std::string::npos);
  s.checkpoint.every = 10;
  EXPECT_NE(
      PlanText(s, ddp).find(absl::StrCat(
          "every 10 steps, 3 kept: checkpoint.dir needs ",
          FormatPlanBytes(4 * ddp.checkpoint_bytes() + WeightsFileBytes(n, model::ModelConfig{})))),
      std::string::npos)
      << PlanText(s, ddp);
  // ZeRO: one range per unit in every shard; the total is the same data.
  s.parallel.zero = 3;
  const v1::Plan z3 = *MakePlan(s, 4);
  EXPECT_EQ(z3.checkpoint_bytes(), 12 * n + 4 * ShardFileBytes(0, z3.units_size()));
  EXPECT_EQ(WeightsFileBytes(n, model::ModelConfig{}), 4 * n + 64);
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
// parallel.reduce_dtype bf16 (NCCL DDP): the gradient all-reduce sends half
// the bytes, and the ranks keep the gradient's bf16 copy (2 B per element)
// as a communication buffer.
TEST(PlanMemoryTest, Bf16GradientReductionHalvesDdpBytesAndKeepsABf16Copy) {
  JobSpec s = SmallSpec(4, 1, 1);
  s.resources.device = DeviceKind::kCuda;
  s.parallel.comm = CommBackend::kNccl;
  const v1::Plan fp32 = *MakePlan(s, 4);
  s.parallel.reduce_dtype = ReduceDtype::kBf16;
  const v1::Plan bf16 = *MakePlan(s, 4);
  EXPECT_EQ(bf16.dp_comm_bytes_per_step() * 2, fp32.dp_comm_bytes_per_step());
  EXPECT_GT(fp32.dp_comm_bytes_per_step(), 0);
  EXPECT_EQ(bf16.memory_per_rank().comm_buffer_bytes(),
            fp32.memory_per_rank().comm_buffer_bytes() + 2 * bf16.num_params());
}

}  // namespace shardtrain
