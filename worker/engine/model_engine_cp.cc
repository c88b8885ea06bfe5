// ModelEngine's context parallelism (model_engine.h): attention as a ring
// over the cp group — each rank's key/value block passed around while every
// rank attends its queries to the block in hand, merged by logsumexp — and
// the defaults of the device's block functions (a device without them is
// refused cp before an engine is made).
#include <cstddef>
#include <cstdint>

#include "worker/engine/model_engine.h"

namespace shardtrain::engine {

void ModelEngine::AttentionBlockForward(void*, float*, void*, float*, void*, const void*,
                                        const void*, const int*, const int*, int, int, int, int,
                                        int, bool) {
  Fail("ModelEngine: this device has no attention by blocks (context parallelism)");
}
void ModelEngine::AttentionRowDot(float*, const void*, const void*, int, int, int, int) {
  Fail("ModelEngine: this device has no attention by blocks (context parallelism)");
}
void ModelEngine::AttentionBlockBackward(void*, void*, void*, void*, const void*, const void*,
                                         const void*, const float*, const float*, const int*,
                                         const int*, int, int, int, int, int) {
  Fail("ModelEngine: this device has no attention by blocks (context parallelism)");
}
void ModelEngine::QkNormForward(void*, void*, float*, int, int, int, int, int) {
  Fail("ModelEngine: this device has no q/k norms (model.qk_norm)");
}
void ModelEngine::QkNormBackward(void*, const void*, const float*, int, int, int, int, int) {
  Fail("ModelEngine: this device has no q/k norms (model.qk_norm)");
}
void ModelEngine::CopyKv(void*, const void*, int, int, int, int) {
  Fail("ModelEngine: this device has no attention by blocks (context parallelism)");
}
void ModelEngine::AddKvGrad(void*, const void*, int, int, int, int) {
  Fail("ModelEngine: this device has no attention by blocks (context parallelism)");
}

// The ring: at pass s, this rank holds the key/value block of cp rank
// (rank − s) mod cp. The pass that brings the next block starts before the
// block in hand is computed (double buffer: cp_kv_ holds two blocks).
void ModelEngine::RingAttentionForward(LayerActs& a, int b, int t) {
  const model::ModelConfig& cfg = config();
  const int tp = layout_.slice().tp, Ct = cfg.q_dim() / tp, NHt = cfg.heads / tp,
            KVHt = cfg.kv_heads / tp, KVt = KVHt * cfg.head_dim();
  const int n = cp_->size(), r = cp_->rank();
  const int64_t block = int64_t{b} * t * 2 * KVt;  // elements of one kv block
  const size_t esz = DataTypeSize(table_.compute());
  char* kv[2] = {static_cast<char*>(cp_kv_), static_cast<char*>(cp_kv_) + block * esz};
  CopyKv(kv[0], a.qkv, b, t, Ct, KVt);
  for (int s = 0; s < n; ++s) {
    const bool more = s + 1 < n;
    if (more) StartRingPass(kv[s % 2], kv[(s + 1) % 2], block);
    const int src = ((r - s) % n + n) % n;
    AttentionBlockForward(a.atty, static_cast<float*>(a.att), cp_out_, cp_rows_, att_scratch_,
                          a.qkv, kv[s % 2], CpPositions(r), CpPositions(src), b, t, Ct, NHt, KVHt,
                          /*first=*/s == 0);
    if (more) FinishRingPass();
  }
}

// Backward's ring carries each block with its gradient: at pass s this
// rank adds its queries' share into the gradient of the block it holds
// (cp rank (rank − s) mod cp's), then passes both on; after the last pass
// one more brings every gradient home. The block in hand is computed while
// the next one arrives; its gradient must be complete before it leaves, so
// gradients go after the arithmetic.
void ModelEngine::RingAttentionBackward(LayerActs& a, int b, int t) {
  const model::ModelConfig& cfg = config();
  const int tp = layout_.slice().tp, Ct = cfg.q_dim() / tp, NHt = cfg.heads / tp,
            KVHt = cfg.kv_heads / tp, KVt = KVHt * cfg.head_dim();
  const int n = cp_->size(), r = cp_->rank();
  const int64_t block = int64_t{b} * t * 2 * KVt;
  const size_t esz = DataTypeSize(table_.compute());
  char* kv[2] = {static_cast<char*>(cp_kv_), static_cast<char*>(cp_kv_) + block * esz};
  char* dkv[2] = {static_cast<char*>(cp_dkv_), static_cast<char*>(cp_dkv_) + block * esz};
  CopyKv(kv[0], a.qkv, b, t, Ct, KVt);
  Zero(dkv[0], block);
  AttentionRowDot(cp_rows_, datty_, a.atty, b, t, Ct, NHt);
  for (int s = 0; s < n; ++s) {
    const int cur = s % 2, next = (s + 1) % 2;
    if (s + 1 < n) StartRingPass(kv[cur], kv[next], block);
    const int src = ((r - s) % n + n) % n;
    AttentionBlockBackward(dqkv_, dkv[cur], att_scratch_, cp_scores_, datty_, a.qkv, kv[cur],
                           static_cast<const float*>(a.att), cp_rows_, CpPositions(r),
                           CpPositions(src), b, t, Ct, NHt, KVHt);
    if (s + 1 < n) FinishRingPass();
    // The gradient of the block just done moves on with it: it arrives
    // where its block is next, and after the last pass at its owner.
    StartRingPass(dkv[cur], dkv[next], block);
    FinishRingPass();
  }
  // After n passes the gradient of this rank's own block is in hand.
  AddKvGrad(dqkv_, dkv[n % 2], b, t, Ct, KVt);
}

void ModelEngine::StartRingPass(const void* send, void* recv, int64_t count) {
  cp_->StartRingPass(send, recv, static_cast<size_t>(count), table_.compute());
}

void ModelEngine::FinishRingPass() { cp_->FinishRingPass(); }

}  // namespace shardtrain::engine
