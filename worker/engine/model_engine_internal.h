// ModelEngine's pieces shared by its source files (model_engine.cc,
// model_engine_block.cc); not part of the engine's interface.
#ifndef SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_INTERNAL_H_
#define SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_INTERNAL_H_

#include <functional>

#include "worker/engine/model_engine.h"

namespace shardtrain::engine {

// Calls the parameter hook (if any) for the unit of `tensor` before and after
// a scope, and lets the device prepare the unit's parameters (OnUnitUse) and
// let them go (OnUnitDone).
class ModelEngine::UnitScope {
 public:
  UnitScope(ModelEngine& gpt, int tensor)
      : gpt_(gpt), hook_(gpt.param_hook_), unit_(gpt.layout_.tensors()[tensor].unit) {
    if (hook_) hook_(unit_, true);
    gpt.OnUnitUse(unit_, gpt.in_backward_);
  }
  ~UnitScope() {
    if (hook_) hook_(unit_, false);
    gpt_.OnUnitDone(unit_);
  }
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;

 private:
  ModelEngine& gpt_;
  const std::function<void(int, bool)>& hook_;
  const int unit_;
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_INTERNAL_H_
