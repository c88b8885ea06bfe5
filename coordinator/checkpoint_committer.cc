#include "coordinator/checkpoint_committer.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::coordinator {

CheckpointCommitter NewFileCheckpointCommitter() {
  auto storage = std::make_shared<checkpoint::FileCheckpointStorage>();
  return [storage](const v1::Job& job, const JobSpec& spec, int64_t step,
                   const std::vector<v1::CheckpointShard>& shards,
                   std::vector<int64_t>* pruned) -> absl::StatusOr<v1::CheckpointInfo> {
    auto config = model::MakeGptConfig(spec.model.layers, spec.model.heads, spec.model.dim,
                                       spec.model.context, spec.model.vocab);
    if (!config.ok()) return config.status();
    const model::ParamLayout layout(*config);
    const std::string step_dir = checkpoint::StepDir(spec.checkpoint.dir, step);
    std::vector<checkpoint::ShardFileInfo> infos;
    int64_t bytes = 0;
    for (const v1::CheckpointShard& s : shards) {
      checkpoint::ShardFileInfo info;
      info.rank = s.rank();
      info.file = checkpoint::ShardFileName(s.rank());
      if (s.path() != checkpoint::JoinPath(step_dir, info.file)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", s.rank(), " wrote ", s.path(), ", expected it in ", step_dir));
      }
      for (const v1::FlatRange& r : s.ranges()) {
        info.ranges.push_back({uint64_t(r.begin()), uint64_t(r.end())});
      }
      info.bytes = uint64_t(s.bytes());
      info.checksum = s.crc64();
      bytes += s.bytes();
      infos.push_back(std::move(info));
    }
    auto manifest =
        checkpoint::MakeManifest(layout, step, job.world(), spec.parallel.zero, std::move(infos));
    if (!manifest.ok()) return manifest.status();
    const std::string path = checkpoint::ManifestPath(step_dir);
    if (auto s = checkpoint::WriteManifest(*storage, path, *manifest); !s.ok()) return s;
    auto removed = checkpoint::PruneOld(*storage, spec.checkpoint.dir, spec.checkpoint.keep);
    if (removed.ok()) {
      for (const std::string& dir : *removed) {
        const size_t slash = dir.find_last_of('/');
        if (auto n = checkpoint::ParseStepDirName(dir.substr(slash + 1))) pruned->push_back(*n);
      }
    }
    v1::CheckpointInfo info;
    info.set_job_id(job.job_id());
    info.set_step(step);
    info.set_dir(step_dir);
    info.set_manifest_path(path);
    info.set_bytes(bytes);
    info.set_world(job.world());
    info.set_committed_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
    return info;
  };
}

}  // namespace shardtrain::coordinator
