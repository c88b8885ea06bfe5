#ifndef SHARDTRAIN_COMMON_STATUS_MACROS_H_
#define SHARDTRAIN_COMMON_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr (abseil's own
// status macros are not part of its public headers).

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define SHARDTRAIN_RETURN_IF_ERROR(expr)                     \
  do {                                                       \
    ::absl::Status shardtrain_status_ = (expr);              \
    if (!shardtrain_status_.ok()) return shardtrain_status_; \
  } while (0)

#define SHARDTRAIN_CONCAT_INNER_(a, b) a##b
#define SHARDTRAIN_CONCAT_(a, b) SHARDTRAIN_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status when it is not
// OK, otherwise moves the value into `lhs` (which may be a declaration).
#define SHARDTRAIN_ASSIGN_OR_RETURN(lhs, rexpr) \
  SHARDTRAIN_ASSIGN_OR_RETURN_IMPL_(SHARDTRAIN_CONCAT_(shardtrain_statusor_, __LINE__), lhs, rexpr)

#define SHARDTRAIN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                      \
  if (!statusor.ok()) return std::move(statusor).status();      \
  lhs = std::move(statusor).value()

#endif  // SHARDTRAIN_COMMON_STATUS_MACROS_H_
