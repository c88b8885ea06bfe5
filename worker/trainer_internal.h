// What trainer.cc and trainer_weights.cc share: walking a rank's flat
// ranges in the whole model's coordinates.
#ifndef SHARDTRAIN_WORKER_TRAINER_INTERNAL_H_
#define SHARDTRAIN_WORKER_TRAINER_INTERNAL_H_

#include <cstddef>

#include "common/model/param_layout.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::worker {

// Calls f(data_offset, global_begin, count) for every piece of the local
// flat `ranges` (sorted; their elements concatenated in a data array, piece
// at data_offset) in the whole model's coordinates, leaving out `skip`
// (sorted; the replicas another rank speaks for). Pieces come in increasing
// global order.
template <typename F>
inline void ForEachGlobalPiece(const model::ParamLayout& layout, const parallel::FlatRanges& ranges,
                               const parallel::FlatRanges& skip, F f) {
  size_t data = 0;  // offset of the current range's first element in the data
  for (const auto& [begin, end] : ranges) {
    for (const model::FlatRun& run : layout.GlobalRuns(begin, end)) {
      parallel::ForEachOutside(run.local, run.local + run.count, skip, [&](size_t a, size_t b) {
        f(data + (a - begin), run.global + (a - run.local), b - a);
      });
    }
    data += end - begin;
  }
}

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_TRAINER_INTERNAL_H_
