#include "worker/engine/cpu/lora_layers.h"

#include "common/model/lora.h"
#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {

template <typename F>
void LoraForward(F* out, int ld_out, F* xa, const F* inp, const F* A, const F* B, F scale, int N,
                 int IC, int OC, int r, ThreadPool* pool) {
  Gemm<F>(false, true, N, r, IC, F(1), inp, IC, A, IC, F(0), xa, r, pool);
  Gemm<F>(false, true, N, OC, r, scale, xa, r, B, r, F(1), out, ld_out, pool);
}

template <typename F>
void LoraBackward(F* dinp, F* dA, F* dB, F* g, const F* dout, int ld_dout, const F* inp,
                  const F* xa, const F* A, const F* B, F scale, int N, int IC, int OC, int r,
                  ThreadPool* pool) {
  // dB (OC, r) += scale · dout^T (OC, N) · xa (N, r)
  Gemm<F>(true, false, OC, r, N, scale, dout, ld_dout, xa, r, F(1), dB, r, pool);
  // g (N, r) = scale · dout (N, OC) · B (OC, r)
  Gemm<F>(false, false, N, r, OC, scale, dout, ld_dout, B, r, F(0), g, r, pool);
  // dA (r, IC) += g^T (r, N) · inp (N, IC)
  Gemm<F>(true, false, r, IC, N, F(1), g, r, inp, IC, F(1), dA, IC, pool);
  // dinp (N, IC) += g (N, r) · A (r, IC)
  if (dinp != nullptr) Gemm<F>(false, false, N, IC, r, F(1), g, r, A, IC, F(1), dinp, IC, pool);
}

template <typename F>
void LoraMerge(F* W, const F* A, const F* B, F scale, int IC, int OC, int r, ThreadPool* pool) {
  // W (OC, IC) += scale · B (OC, r) · A (r, IC)
  Gemm<F>(false, false, OC, IC, r, scale, B, r, A, IC, F(1), W, IC, pool);
}

void MergeLora(const model::ParamLayout& layout, const float* adapters, float* frozen,
               ThreadPool* pool) {
  const model::ModelConfig& c = layout.config();
  if (!c.lora.on()) return;
  const auto scale = static_cast<float>(c.lora.scale());
  for (int i = 0; i < layout.num_layers(); ++i) {
    const int l = layout.layer(i);
    for (int t = 0; t < model::kNumLoraTargets; ++t) {
      const auto target = model::LoraTarget(t);
      const int A = layout.lora_tensor(l, target, false);
      if (A < 0) continue;
      const model::LoraSite site = model::LoraTargetSite(c, target, layout.slice().tp);
      float* W = frozen + layout.offset(layout.block_tensor(l, model::LoraTargetTensor(target))) +
                 site.first_col * site.in;
      LoraMerge<float>(W, adapters + layout.offset(A), adapters + layout.offset(A + 1), scale,
                       static_cast<int>(site.in), static_cast<int>(site.out), c.lora.rank, pool);
    }
  }
}

#define SHARDTRAIN_LORA_INSTANTIATE(F)                                                           \
  template void LoraForward<F>(F*, int, F*, const F*, const F*, const F*, F, int, int, int, int, \
                               ThreadPool*);                                                     \
  template void LoraBackward<F>(F*, F*, F*, F*, const F*, int, const F*, const F*, const F*,     \
                                const F*, F, int, int, int, int, ThreadPool*);                   \
  template void LoraMerge<F>(F*, const F*, const F*, F, int, int, int, ThreadPool*);
SHARDTRAIN_LORA_INSTANTIATE(float)
SHARDTRAIN_LORA_INSTANTIATE(double)
#undef SHARDTRAIN_LORA_INSTANTIATE

}  // namespace shardtrain::engine::cpu
