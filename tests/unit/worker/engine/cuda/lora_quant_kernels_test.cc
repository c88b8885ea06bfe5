// LoRA and QLoRA on the GPU (label gpu: skips without a device): the
// dequantization kernel against worker/quant's (exact in fp32, the bf16
// rounding of it in bf16), the adapters' GEMMs against the CPU's
// (engine/cpu/lora_layers.h), a frozen weight's backward that computes the
// input gradient alone, and the CUDA engine with adapters on an NF4 model
// against the CPU engine on the same weights.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "common/model/weight_quant.h"
#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cpu/lora_layers.h"
#include "worker/engine/cuda/cuda_model.h"
#include "worker/optim/quant8.h"
#include "worker/quant/weight_quant.h"

namespace shardtrain::engine::cuda {
namespace {

TEST_F(CudaKernelsTest, DequantizeRowsEqualsTheHostsInEveryFormat) {
  const int64_t rows = 130, cols = 96, r0 = 3, n = 70;
  const std::vector<float> w = Uniform(rng_, size_t(rows * cols));
  struct Case {
    const char* name;
    bool int8, double_quant;
  };
  for (const Case& c :
       {Case{"int8", true, false}, Case{"nf4", false, false}, Case{"nf4 dq", false, true}}) {
    const quant::QuantizedWeight q =
        c.int8 ? quant::QuantizeInt8Rows(w.data(), rows, cols, nullptr)
               : quant::QuantizeNf4(w.data(), rows, cols, c.double_quant, nullptr);
    std::vector<float> want(size_t(n * cols));
    quant::DequantizeRows(q.view(), r0, r0 + n, want.data());
    DevicePtr codes = UploadBytes(q.codes.data(), q.codes.size());
    DevicePtr absmax = UploadF32(q.absmax);
    DevicePtr absmax_codes = UploadBytes(q.absmax_codes.data(), q.absmax_codes.size());
    DevicePtr scale = UploadF32(q.absmax_scale);
    const optim::Quant8Map& map = optim::SignedDynamicMap();
    DevicePtr dmap = UploadF32(std::vector<float>(map.begin(), map.end()));
    DeviceQuantWeight d;
    d.int8 = c.int8;
    d.rows = rows;
    d.cols = cols;
    d.codes = static_cast<const uint8_t*>(codes.get());
    if (q.absmax_codes.empty()) {
      d.absmax = static_cast<const float*>(absmax.get());
    } else {
      d.absmax_codes = static_cast<const uint8_t*>(absmax_codes.get());
      d.absmax_scale = static_cast<const float*>(scale.get());
      d.absmax_offset = q.absmax_offset;
      d.dynamic_map = static_cast<const float*>(dmap.get());
    }
    for (DataType dt : {kF32, DataType::kBFloat16}) {
      DevicePtr tile = Alloc(size_t(n * cols) * DataTypeSize(dt));
      ASSERT_OK(DequantizeRows(Ctx(dt), tile.get(), d, r0, n));
      const std::vector<float> got = Download(dt, tile.get(), size_t(n * cols));
      CompareAndPrint("dequantize", got, Rounded(dt, want), 0.0,
                      std::string(c.name) + " " + std::string(DataTypeName(dt)));
    }
  }
}

TEST_F(CudaKernelsTest, LoraGemmsEqualTheCpus) {
  const int N = 24, IC = 40, OC = 56, r = 4, ld = OC + 8;
  const float scale = 2.0f;
  const std::vector<float> inp = Uniform(rng_, size_t(N) * IC), A = Uniform(rng_, size_t(r) * IC),
                           B = Uniform(rng_, size_t(OC) * r), out0 = Uniform(rng_, size_t(N) * ld),
                           dout = Uniform(rng_, size_t(N) * ld),
                           dinp0 = Uniform(rng_, size_t(N) * IC);
  for (DataType dt : {kF32, DataType::kBFloat16}) {
    // The CPU on the inputs as the GPU sees them (rounded to dt).
    const std::vector<float> ri = Rounded(dt, inp), rA = Rounded(dt, A), rB = Rounded(dt, B);
    std::vector<float> out = Rounded(dt, out0), xa(size_t(N) * r), g(size_t(N) * r),
                       dinp = Rounded(dt, dinp0), dA(size_t(r) * IC, 0.5f),
                       dB(size_t(OC) * r, 0.25f);
    const std::vector<float> rdout = Rounded(dt, dout);
    cpu::LoraForward<float>(out.data(), ld, xa.data(), ri.data(), rA.data(), rB.data(), scale, N,
                            IC, OC, r, nullptr);
    cpu::LoraBackward<float>(dinp.data(), dA.data(), dB.data(), g.data(), rdout.data(), ld,
                             ri.data(), xa.data(), rA.data(), rB.data(), scale, N, IC, OC, r,
                             nullptr);
    const KernelCtx& ctx = Ctx(dt);
    DevicePtr d_inp = Upload(dt, inp), d_A = Upload(dt, A), d_B = Upload(dt, B),
              d_out = Upload(dt, out0), d_dout = Upload(dt, dout), d_dinp = Upload(dt, dinp0),
              d_xa = Alloc(size_t(N) * r * 4), d_g = Alloc(size_t(N) * r * 4),
              d_dA = UploadF32(std::vector<float>(size_t(r) * IC, 0.5f)),
              d_dB = UploadF32(std::vector<float>(size_t(OC) * r, 0.25f));
    ASSERT_OK(LoraForward(ctx, d_out.get(), ld, d_xa.get(), d_inp.get(), d_A.get(), d_B.get(),
                          scale, N, IC, OC, r));
    ASSERT_OK(LoraBackward(ctx, d_dinp.get(), static_cast<float*>(d_dA.get()),
                           static_cast<float*>(d_dB.get()), d_g.get(), d_xa.get(), d_dout.get(), ld,
                           d_inp.get(), d_A.get(), d_B.get(), scale, N, IC, OC, r));
    const double tol = dt == kF32 ? kFp32Tol : kLowPrecisionTol;
    const std::string name(DataTypeName(dt));
    CompareAndPrint("lora", Download(dt, d_out.get(), out.size()), out, tol, name + " out");
    CompareAndPrint("lora", Download(dt, d_dinp.get(), dinp.size()), dinp, tol, name + " dinp");
    CompareAndPrint("lora", DownloadF32(d_dA.get(), dA.size()), dA, tol, name + " dA");
    CompareAndPrint("lora", DownloadF32(d_dB.get(), dB.size()), dB, tol, name + " dB");
  }
}

// A frozen weight: MatmulBackward with no weight or bias gradient computes
// dinp and touches nothing else.
TEST_F(CudaKernelsTest, MatmulBackwardOfAFrozenWeightIsTheInputsAlone) {
  const int N = 16, C = 32, OC = 48;
  const std::vector<float> dout = Uniform(rng_, size_t(N) * OC), w = Uniform(rng_, size_t(OC) * C),
                           inp = Uniform(rng_, size_t(N) * C);
  std::vector<float> want(size_t(N) * C, 0.0f);
  cpu::MatmulBackward(want.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                      dout.data(), OC, inp.data(), w.data(), N, C, OC, nullptr);
  DevicePtr d_dout = UploadF32(dout), d_w = UploadF32(w), d_dinp = Alloc(want.size() * 4);
  ASSERT_OK(MatmulBackward(Ctx(kF32), d_dinp.get(), nullptr, nullptr, d_dout.get(), OC, nullptr,
                           d_w.get(), N, C, OC, /*overwrite_dinp=*/true));
  CompareAndPrint("frozen", DownloadF32(d_dinp.get(), want.size()), want, kFp32Tol, "dinp");
}

// The engines with rank-4 adapters on every projection of a Llama whose
// linear layers are NF4 (double-quantized): the same frozen weights and
// adapters give the CPU's loss and adapter gradients (fp32 compute), and
// within bf16's tolerance in bf16.
TEST_F(CudaKernelsTest, QloraEngineEqualsTheCpuEngine) {
  model::ModelConfig c = *model::MakeLlamaConfig({2, 4, 2, 64, 96, 32, 256, 1e4, 1e-5, false});
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.targets = (1u << model::kNumLoraTargets) - 1;
  const int B = 2, T = 16;
  ModelEngineOptions o;
  o.frozen.quant = model::FrozenQuant::kNf4;
  auto cpu_model = cpu::CpuModel::Create(c, B, T, 2, o);
  ASSERT_TRUE(cpu_model.ok()) << cpu_model.status();
  cpu::CpuModel& ref = **cpu_model;
  std::vector<float> frozen(ref.frozen_layout().num_params());
  ref.InitFrozenInto(7, 0, frozen.size(), frozen.data());
  ref.SetFrozen(frozen.data());
  ref.InitParams(7);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> adapters(ref.params().f32().begin(), ref.params().f32().end());
  for (const model::TensorInfo& t : ref.layout().tensors()) {
    if (!t.frozen && t.name.back() == 'B') {
      for (size_t i = 0; i < t.numel; ++i) adapters[t.offset + i] = nd(rng);
    }
  }
  std::copy(adapters.begin(), adapters.end(), ref.params().f32().begin());
  std::vector<int> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = int(rng() % 256);
    targets[i] = int(rng() % 256);
  }
  ref.ZeroGrad();
  const float want_loss = ref.Forward(tokens.data(), targets.data());
  ref.Backward();
  const std::vector<float> want_grads(ref.grads().f32().begin(), ref.grads().f32().end());
  for (DataType dt : {kF32, DataType::kBFloat16}) {
    auto gpu = CudaModel::Create(c, B, T, 0, dt, 2, o);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    CudaModel& m = **gpu;
    m.SetFrozen(frozen.data());
    std::vector<float> held(frozen.size()), want_held(frozen.size());
    m.GetFrozen(held.data());
    ref.GetFrozen(want_held.data());
    CompareAndPrint("qlora", held, want_held, dt == kF32 ? 0.0 : kLowPrecisionTol,
                    "frozen model held, " + std::string(DataTypeName(dt)));
    m.math().CopyFromHost(static_cast<float*>(m.params().data), adapters.data(), adapters.size());
    m.ZeroGrad();
    const float loss = m.Forward(tokens.data(), targets.data());
    m.Backward();
    std::vector<float> grads(want_grads.size());
    m.math().CopyToHost(grads.data(), static_cast<const float*>(m.grads().data), grads.size());
    const double tol = dt == kF32 ? 1e-4 : 5e-2;
    std::printf("[qlora] %s: loss %.7f vs the CPU engine's %.7f\n",
                std::string(DataTypeName(dt)).c_str(), loss, want_loss);
    EXPECT_NEAR(loss, want_loss, (dt == kF32 ? 1e-5 : 2e-2) * want_loss);
    CompareAndPrint("qlora", grads, want_grads, tol,
                    "adapters' gradients, " + std::string(DataTypeName(dt)));
    EXPECT_EQ(m.frozen_bytes() > 0, true);
  }
}

}  // namespace
}  // namespace shardtrain::engine::cuda
