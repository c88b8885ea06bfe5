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

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_GRPC_STATUS_H_
