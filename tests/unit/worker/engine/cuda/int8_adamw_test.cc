// 8-bit AdamW with its state in a GPU's memory (FlatMath::AdamW8bitUpdate,
// optim/adamw.h's device Int8State) against the host's (optim/adamw8bit.h):
// a two-block GPT whose units hold partial blocks and decayed and undecayed
// tensors side by side, three steps with the clip factor, the parameters,
// the moments and the zeroed gradients equal bit for bit; a checkpoint's
// state set on the device comes back as it went in. GTEST_SKIP without a
// GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/model/param_layout.h"
#include "worker/engine/cuda/cuda_device.h"
#include "worker/engine/cuda/cuda_model.h"
#include "worker/optim/adamw.h"

namespace shardtrain::engine::cuda {
namespace {

bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size()
                        << " differ, the first at " << first << " (" << got[first] << " vs "
                        << want[first] << ")";
}

TEST(Int8AdamWOnDeviceTest, StepsAsTheHostBitForBitAndSetsStateBack) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto config = model::MakeGptConfig(/*layers=*/2, /*heads=*/2, /*dim=*/48, /*context=*/16,
                                     /*vocab=*/61);
  ASSERT_TRUE(config.ok()) << config.status();
  const model::ParamLayout layout(*config);
  const size_t n = layout.num_params();
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  std::unique_ptr<FlatMath> math = MakeCudaFlatMath(device->get());
  optim::AdamWOptions options;
  options.weight_decay = 0.1f;
  options.int8_state = true;
  auto host = optim::AdamW::Create(layout, 0, n, options);
  auto gpu = optim::AdamW::Create(layout, 0, n, options, math.get());
  ASSERT_TRUE(host.ok() && gpu.ok()) << host.status() << gpu.status();
  EXPECT_EQ(gpu->state_bytes(), host->state_bytes());

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), g(n);
  for (float& x : p) x = 0.05f * normal(rng);
  std::unique_ptr<Buffer> d_p = math->Allocate(n), d_g = math->Allocate(n);
  math->CopyFromHost(d_p->as<float>(), p.data(), n);
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    // Gradients spanning decades, a block of zeros among them.
    for (size_t i = 0; i < n; ++i) g[i] = i % 5000 < 300 ? 0.0f : normal(rng) * (i % 7 + 1) * 1e-3f;
    const float lr = 1e-3f * step, clip = 0.75f;
    std::vector<float> scaled(g);
    for (float& x : scaled) x *= clip;  // the host's clip: the same product
    math->CopyFromHost(d_g->as<float>(), g.data(), n);
    host->Step(absl::MakeSpan(p), absl::MakeConstSpan(scaled), lr, nullptr);
    gpu->Step(d_p->as<float>(), d_g->as<float>(), lr, /*zero_grads=*/true, clip);
    std::vector<float> got(n), grads(n, 1.0f);
    math->CopyToHost(got.data(), d_p->as<float>(), n);
    math->CopyToHost(grads.data(), d_g->as<float>(), n);
    ExpectSameBits(got, p, "params");
    EXPECT_EQ(grads, std::vector<float>(n, 0.0f)) << "zero_grads";
  }
  ExpectSameBits(gpu->CopyM(0, n), host->CopyM(0, n), "m");
  ExpectSameBits(gpu->CopyV(0, n), host->CopyV(0, n), "v");
  ExpectSameBits(gpu->CopyM(1000, 9000), host->CopyM(1000, 9000), "m [1000, 9000)");

  // A checkpoint's state into a fresh device optimizer: the same values out.
  auto restored = optim::AdamW::Create(layout, 0, n, options, math.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  const std::vector<float> m = host->CopyM(0, n), v = host->CopyV(0, n);
  restored->SetState(m, v);
  ExpectSameBits(restored->CopyM(0, n), m, "m set back");
  ExpectSameBits(restored->CopyV(0, n), v, "v set back");
}

}  // namespace
}  // namespace shardtrain::engine::cuda
