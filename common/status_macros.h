// Early-return helpers for absl::Status, with the semantics of the macros in
// later Abseil releases (Debian's Abseil 20220623 has none).
#ifndef SONDE_COMMON_STATUS_MACROS_H_
#define SONDE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status from the enclosing function if `expr` is not OK.
#define SONDE_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status sonde_status_ = (expr);           \
    if (!sonde_status_.ok()) return sonde_status_;   \
  } while (false)

#define SONDE_STATUS_CONCAT_INNER_(a, b) a##b
#define SONDE_STATUS_CONCAT_(a, b) SONDE_STATUS_CONCAT_INNER_(a, b)

// `lhs = value of expr`, or returns the error status of `expr`.
// Usage: SONDE_ASSIGN_OR_RETURN(auto db, Open(path));
#define SONDE_ASSIGN_OR_RETURN(lhs, expr)                                   \
  SONDE_ASSIGN_OR_RETURN_IMPL_(                                             \
      SONDE_STATUS_CONCAT_(sonde_statusor_, __LINE__), lhs, expr)

#define SONDE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // SONDE_COMMON_STATUS_MACROS_H_
