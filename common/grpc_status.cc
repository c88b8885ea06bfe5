#include "common/grpc_status.h"

#include "absl/strings/str_cat.h"

namespace shardtrain {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = what.empty() ? s.error_message() : absl::StrCat(what, ": ", s.error_message());
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

}  // namespace shardtrain
