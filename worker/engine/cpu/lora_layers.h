// A LoRA adapter on a linear layer (Hu et al. 2021), as free functions like
// layers.h's: beside the frozen weight W (OC, IC), a trained pair A (r, IC)
// and B (OC, r) whose product, times scale = alpha / r, is added to W's
// output:
//   out += scale · (inp · A^T) · B^T
// B starts at zero, so an adapter at step 0 leaves the model as it was.
// Only the adapter's tensors get gradients; the frozen weight's matmul
// (layers.h's MatmulForward, or quant_matmul.h's on a quantized weight)
// gives the input its share of the gradient on its own.
//
// Templates on the float type F (float for the engines, double for the
// finite-difference tests); backward functions ACCUMULATE (+=).
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_LORA_LAYERS_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_LORA_LAYERS_H_

#include "common/model/param_layout.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

// xa (N, r) = inp (N, IC) · A^T, saved for the backward; out (N, OC, row
// stride ld_out) += scale · xa · B^T.
template <typename F>
void LoraForward(F* out, int ld_out, F* xa, const F* inp, const F* A, const F* B, F scale, int N,
                 int IC, int OC, int r, ThreadPool* pool);

// From dout (N, OC, row stride ld_dout): with g = scale · dout · B (N, r,
// written to the scratch g),
//   dB (OC, r) += scale · dout^T · xa,  dA (r, IC) += g^T · inp,
//   dinp (N, IC) += g · A   (dinp null: not wanted, e.g. the first layer's).
template <typename F>
void LoraBackward(F* dinp, F* dA, F* dB, F* g, const F* dout, int ld_dout, const F* inp,
                  const F* xa, const F* A, const F* B, F scale, int N, int IC, int OC, int r,
                  ThreadPool* pool);

// The merged weight W' = W + scale · B · A, in place on W (OC, IC): what an
// exported model holds, whose plain matmul equals the adapted layer's output.
template <typename F>
void LoraMerge(F* W, const F* A, const F* B, F scale, int IC, int OC, int r, ThreadPool* pool);

// Every adapter of a LoRA layout merged into its frozen weight: frozen (the
// layout's frozen buffer, host fp32, laid out as ParamLayout(BaseConfig(
// config), slice)) += scale · B · A at each target's rows, from adapters
// (the layout's flat buffer, host fp32). The result is the model whose
// plain forward equals the adapted one (what `export` and `sample` read).
void MergeLora(const model::ParamLayout& layout, const float* adapters, float* frozen,
               ThreadPool* pool);

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_LORA_LAYERS_H_
