#include "coordinator/plan_builder.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::coordinator {

absl::StatusOr<v1::Plan> BuildPlan(const SpecSummary& spec, const v1::Job& job) {
  const int dp = spec.dp, tp = spec.tp, pp = spec.pp;
  if (dp * tp * pp != job.ranks_size()) {
    return absl::InvalidArgumentError(absl::StrCat("dp·tp·pp = ", dp, "·", tp, "·", pp, " = ",
                                                   dp * tp * pp, " ≠ world ", job.ranks_size()));
  }
  v1::Plan plan;
  plan.set_job_id(job.job_id());
  plan.set_generation(job.generation());
  plan.set_world(job.ranks_size());
  plan.set_dp(dp);
  plan.set_tp(tp);
  plan.set_pp(pp);
  plan.set_zero_stage(spec.zero);
  plan.set_micro_batch(static_cast<int>(spec.micro_batch));
  const int64_t per_dp = spec.global_batch / dp;  // samples per step of one dp slice
  plan.set_grad_accum_steps(spec.micro_batch > 0 ? static_cast<int>(per_dp / spec.micro_batch)
                                                 : 1);
  plan.set_seq_len(static_cast<int>(spec.seq_len));
  plan.set_global_batch(spec.global_batch);
  plan.set_schedule(spec.schedule);
  const int m = plan.grad_accum_steps();
  plan.set_bubble_fraction(pp > 1 ? double(pp - 1) / double(m + pp - 1) : 0.0);
  for (int r = 0; r < job.ranks_size(); ++r) {
    v1::RankPlan* rp = plan.add_ranks();
    rp->set_rank(r);
    rp->set_tp(r % tp);
    rp->set_dp((r / tp) % dp);
    rp->set_pp(r / (tp * dp));
    rp->set_worker_id(job.ranks(r).worker_id());
    rp->set_first_sample(rp->dp() * per_dp);
    rp->set_num_samples(per_dp);
  }
  // One group per line of the mesh along each axis.
  auto add_groups = [&](const char* kind, int count, auto member_of) {
    for (int g = 0; g < count; ++g) {
      v1::Group* group = plan.add_groups();
      group->set_kind(kind);
      group->set_index(g);
      for (int r = 0; r < job.ranks_size(); ++r) {
        if (member_of(plan.ranks(r), g)) group->add_ranks(r);
      }
    }
  };
  add_groups("dp", tp * pp, [&](const v1::RankPlan& r, int g) {
    return r.tp() == g % tp && r.pp() == g / tp;
  });
  add_groups("tp", dp * pp, [&](const v1::RankPlan& r, int g) {
    return r.dp() == g % dp && r.pp() == g / dp;
  });
  add_groups("pp", dp * tp, [&](const v1::RankPlan& r, int g) {
    return r.tp() == g % tp && r.dp() == g / tp;
  });
  return plan;
}

}  // namespace shardtrain::coordinator
