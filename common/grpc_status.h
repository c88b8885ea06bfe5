// The one place that converts between absl::Status (domain) and grpc::Status
// (wire). Codes map one to one (both follow google.rpc.Code), so a handler
// can return a domain error unchanged and a client gets the same code back.
#ifndef SHARDTRAIN_COMMON_GRPC_STATUS_H_
#define SHARDTRAIN_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace shardtrain {

grpc::Status ToGrpcStatus(const absl::Status& s);
// `what` prefixes the message ("SubmitJob: ..."); may be empty.
absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what = "");

// Begins the message of the coordinator's UNAVAILABLE when it answered but
// its state store could not take a write (etcd without a majority): the
// client then says so instead of "cannot reach the coordinator".
inline constexpr char kStateStoreUnavailable[] = "the coordinator cannot store its state: ";
// Begins the message of a standby coordinator's UNAVAILABLE (several
// coordinators on one etcd: one leads), which names the leader's address.
inline constexpr char kCoordinatorStandby[] = "this coordinator is a standby: ";

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_GRPC_STATUS_H_
