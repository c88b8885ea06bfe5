// Test helpers: requests carrying the secrets a real worker presents (its
// registration secret, its assignment's lease token), derived from one key
// that every coordinator a test creates shares (TestOptions), as the real
// one's state directory keeps it across restarts.
#ifndef SHARDTRAIN_TESTS_UNIT_COORDINATOR_FENCED_H_
#define SHARDTRAIN_TESTS_UNIT_COORDINATOR_FENCED_H_

#include "coordinator/coordinator.h"
#include "coordinator/fencing.h"

namespace shardtrain::coordinator {

inline const FencingKey& TestKey() {
  static const FencingKey key = FencingKey::Random();
  return key;
}
inline CoordinatorOptions TestOptions() {
  CoordinatorOptions o;
  o.fencing_key = TestKey();
  return o;
}

inline v1::RegisterWorkerRequest Fenced(v1::RegisterWorkerRequest r) {
  r.set_worker_secret(TestKey().WorkerSecret(r.previous_worker_id()));
  return r;
}
inline v1::HeartbeatRequest Fenced(v1::HeartbeatRequest r) {
  r.set_worker_secret(TestKey().WorkerSecret(r.worker_id()));
  return r;
}
inline v1::ReportStepRequest Fenced(v1::ReportStepRequest r) {
  r.set_lease_token(TestKey().LeaseToken(r.report().job_id(), r.report().generation()));
  return r;
}
inline v1::ReportCheckpointRequest Fenced(v1::ReportCheckpointRequest r) {
  r.set_lease_token(TestKey().LeaseToken(r.shard().job_id(), r.shard().generation()));
  return r;
}
// The requests with job_id and generation fields of their own.
template <typename Req>
Req Fenced(Req r) {
  r.set_lease_token(TestKey().LeaseToken(r.job_id(), r.generation()));
  return r;
}

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_TESTS_UNIT_COORDINATOR_FENCED_H_
