// Trainer's Mixture-of-Experts parts (trainer.h): the step's router figures
// and DeepSeek-V3's aux-loss-free bias update between steps.
#include <algorithm>
#include <vector>

#include "worker/engine/cpu/moe_layers.h"
#include "worker/trainer.h"

namespace shardtrain::worker {

void MoeFigures(const engine::MoeStats& st, StepResult* r) {
  if (st.forwards == 0) return;
  r->moe_aux_loss = st.aux_loss / st.forwards;
  r->moe_z_loss = st.z_loss / st.forwards;
  r->moe_dropped = st.pairs > 0 ? double(st.dropped) / double(st.pairs) : 0;
  for (const std::vector<int64_t>& load : st.load) {
    int64_t sum = 0, most = 0;
    for (int64_t n : load) {
      sum += n;
      most = std::max(most, n);
    }
    if (sum > 0) r->moe_max_load = std::max(r->moe_max_load, double(most) * load.size() / sum);
  }
}

absl::Status Trainer::UpdateRouterBiases(const engine::MoeStats& st) {
  const double rate = spec_.router.bias_update_rate;
  if (rate <= 0 || st.load.empty()) return absl::OkStatus();
  const model::ParamLayout& layout = engine_->layout();
  const int E = layout.config().moe.experts;
  // The step's pairs per expert of each of this stage's MoE layers, over
  // every replica's tokens (dp × cp; a replica's tp ranks route alike):
  // every rank then moves its copy of the bias alike. Exact in fp32 below
  // 2^24 pairs per expert; the update reads only their signs.
  std::vector<float> load;
  for (const std::vector<int64_t>& l : st.load) load.insert(load.end(), l.begin(), l.end());
  if (replica_comm_ != nullptr && replica_comm_->size() > 1) {
    if (absl::Status s = replica_comm_->AllReduce(load.data(), load.size(),
                                                  comm::DataType::kFloat32, comm::ReduceOp::kSum);
        !s.ok()) {
      return s;
    }
  }
  // The engine's parameters are its fp32 master here (the CPU engine: MoE
  // runs there only); ZeRO-3, which would hold a shard, is refused by the
  // spec.
  float* params = static_cast<float*>(engine_->params().data);
  std::vector<int> counts(E);
  size_t k = 0;
  for (int i = 0; i < layout.num_layers(); ++i) {
    const int l = layout.layer(i);
    if (!layout.config().moe_layer(l)) continue;
    for (int e = 0; e < E; ++e) counts[e] = static_cast<int>(load[k * E + e]);
    engine::cpu::AuxFreeBiasUpdate(params + layout.offset(layout.block_tensor(l, model::kRouterB)),
                                   counts.data(), E, static_cast<float>(rate));
    ++k;
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::worker
