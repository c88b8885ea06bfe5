// Coordinator calls whose answers are bounded whatever the state holds:
// ListJobs (pages of summaries) and the KV's job check.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/text_bounds.h"
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;

// A job as ListJobs shows it: no spec, ranks or checkpoints (GetJob has
// them), every free-text field truncated. Under 2 KiB whatever the job.
v1::Job Summary(const v1::Job& j) {
  v1::Job s = j;
  s.clear_spec_yaml();
  s.clear_ranks();
  s.clear_done_ranks();
  s.clear_checkpoints();
  s.set_name(Truncate(j.name()));
  s.set_failure_reason(Truncate(j.failure_reason()));
  s.set_resume_from(Truncate(j.resume_from()));
  s.set_output(Truncate(j.output()));
  s.set_pending_reason(Truncate(j.pending_reason()));
  s.set_device(Truncate(j.device()));
  s.set_owner(Truncate(j.owner()));
  return s;
}

}  // namespace

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& req) const {
  if (req.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be >= 0, got ", req.page_size()));
  }
  const int page_size =
      req.page_size() == 0 ? kDefaultPageSize : std::min(req.page_size(), kMaxPageSize);
  std::lock_guard<std::mutex> lock(mu_);
  // The token is the id of the last job of the previous page: job ids are
  // never reused and job_order_ only grows, so a page never repeats or skips
  // a job however the list changes in between.
  size_t start = 0;
  if (!req.page_token().empty()) {
    auto it = std::find(job_order_.begin(), job_order_.end(), req.page_token());
    if (it == job_order_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("page_token: \"",
                                                     Truncate(req.page_token(), 64),
                                                     "\" is not one this coordinator handed out"));
    }
    start = static_cast<size_t>(it - job_order_.begin()) + 1;
  }
  v1::ListJobsResponse resp;
  for (size_t i = start; i < job_order_.size(); ++i) {
    const v1::Job& j = jobs_.at(job_order_[i]).job;
    if (req.states_size() > 0 &&
        std::find(req.states().begin(), req.states().end(), j.state()) == req.states().end()) {
      continue;
    }
    if (!req.owner().empty() && j.owner() != req.owner()) continue;
    if (resp.jobs_size() == page_size) {
      resp.set_next_page_token(job_order_[i - 1]);
      break;
    }
    *resp.add_jobs() = Summary(j);
  }
  return resp;
}

absl::Status Coordinator::CheckKvAccess(const std::string& job_id, int64_t generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", Truncate(job_id, 64), " not found"));
  const v1::JobState state = e->job.state();
  if (state != v1::JOB_STATE_SCHEDULED && state != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateLabel(state), ": no rendezvous now"));
  }
  if (generation != e->job.generation()) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " is at generation ",
                                           e->job.generation(), ", not ", generation));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::coordinator
