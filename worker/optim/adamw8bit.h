// AdamW with block-wise 8-bit moments (bitsandbytes' AdamW8bit): m and v are
// kept as uint8 codes with one fp32 absmax per block of kQuant8BlockSize
// elements (quant8.h; m on the signed dynamic map, v on the unsigned one),
// 2·n + 8·ceil(n/2048) bytes instead of fp32 AdamW's 8·n.
//
// Each block is updated in one pass: its m and v are dequantized into a local
// buffer, every element takes fp32 AdamW's update (adamw.h, step t from 1)
//   g = grad · grad_scale
//   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g²
//   p = p · decay - (lr / (1-b1^t)) · m / (sqrt(v) / sqrt(1-b2^t) + eps)
// with decay = 1 - lr·weight_decay where the element's DecayRange says so
// (1 elsewhere), using the updated m and v at full precision, and then m and
// v are requantized with the block's new absmax. The multiply-adds are fused
// (std::fma: 1 - lr·wd, b1·m + …, b2·v + …, sqrt(v)·(1/sqrt(1-b2^t)) + eps,
// p·decay - …) so that the bits do not depend on the compiler's contraction
// flags; the result is deterministic and independent of the thread pool.
// (bitsandbytes' kernel decays after the update and quantizes x·(1/absmax)
// by midpoints; here the order is fp32 AdamW's, the quantization quant8.h's.)
//
// Caveat, as in bitsandbytes: v below 1.6e-7 of its block's largest v (a
// gradient under ~4e-4 of the block's largest) is stored as 0, while m keeps
// values down to 5.5e-7 of its absmax; an element whose gradient has died
// out but whose m has not then steps by up to lr·m/eps. Blocks whose
// gradients span many decades (embedding rows of rare tokens, a converged
// quadratic) are better kept on fp32 AdamW, as bitsandbytes advises for
// embeddings.
#ifndef SHARDTRAIN_WORKER_OPTIM_ADAMW8BIT_H_
#define SHARDTRAIN_WORKER_OPTIM_ADAMW8BIT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/param_layout.h"
#include "worker/engine/flat_math.h"
#include "worker/engine/thread_pool.h"
#include "worker/optim/adamw.h"
#include "worker/optim/quant8.h"

namespace shardtrain::optim {

// Elements [begin, end) of the optimizer's range and whether they take weight
// decay (AdamW's Segment: one piece of a tensor, TensorInfo::decay). Elements
// that no range covers take no decay.
struct DecayRange {
  size_t begin = 0, end = 0;
  bool decay = false;
};

// The decay ranges of elements [offset, offset + count) of `layout`'s flat
// buffer, relative to offset: one per tensor piece, neighbours with the same
// rule merged (AdamW::Create's segments), sorted and covering [0, count).
// The range must lie inside the layout.
std::vector<DecayRange> DecayRanges(const model::ParamLayout& layout, size_t offset, size_t count);

// The scalars of one step.
struct AdamW8bitStep {
  float lr = 0.0f;
  int64_t t = 1;            // the step number, from 1 (bias correction)
  float grad_scale = 1.0f;  // the update reads grads · grad_scale (clip factor)
};

// The step's coefficients as the update uses them (engine/flat_math.h's,
// shared with a device's 8-bit update: FlatMath::AdamW8bitUpdate), decay
// being a decayed element's factor 1 - lr·weight_decay (fused).
engine::AdamWCoefficients AdamW8bitCoefficients(const AdamWOptions& options,
                                                const AdamW8bitStep& step);

// One AdamW step of blocks [block_begin, block_end) of a range of n elements
// (n = params.size(); block b is elements [b·2048, min((b+1)·2048, n))):
// updates params, m and v of those blocks in place, as the file comment says,
// and touches nothing else. grads are only read. m and v hold the range's
// 8-bit moments (codes: n each, absmax: Quant8Blocks(n) each; zero-filled is
// the state before step 1). decay: sorted, non-overlapping ranges within
// [0, n). Blocks are spread over `pool` (null: serial).
// Disjoint block ranges covering [0, Quant8Blocks(n)) make one step (the
// same bits as AdamW8bitUpdate).
// InvalidArgument, with nothing written, when a size does not match n, the
// block range is not within [0, Quant8Blocks(n)], step.t < 1, or the decay
// ranges are unsorted, overlapping or beyond n.
absl::Status AdamW8bitUpdateBlocks(absl::Span<float> params, absl::Span<const float> grads,
                                   Quant8Span m, Quant8Span v, absl::Span<const DecayRange> decay,
                                   const AdamWOptions& options, const AdamW8bitStep& step,
                                   size_t block_begin, size_t block_end, engine::ThreadPool* pool);

// AdamW8bitUpdateBlocks over every block: one whole step of the range.
absl::Status AdamW8bitUpdate(absl::Span<float> params, absl::Span<const float> grads, Quant8Span m,
                             Quant8Span v, absl::Span<const DecayRange> decay,
                             const AdamWOptions& options, const AdamW8bitStep& step,
                             engine::ThreadPool* pool);

}  // namespace shardtrain::optim

#endif  // SHARDTRAIN_WORKER_OPTIM_ADAMW8BIT_H_
