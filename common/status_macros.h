// Early-return helpers for absl::Status / absl::StatusOr.
#ifndef BATON_COMMON_STATUS_MACROS_H_
#define BATON_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define BATON_STATUS_CONCAT_INNER_(x, y) x##y
#define BATON_STATUS_CONCAT_(x, y) BATON_STATUS_CONCAT_INNER_(x, y)

// Returns the status from the enclosing function if `expr` is not OK.
#define BATON_RETURN_IF_ERROR(expr)                               \
  do {                                                            \
    if (absl::Status _baton_status = (expr); !_baton_status.ok()) \
        [[unlikely]] {                                            \
      return _baton_status;                                       \
    }                                                             \
  } while (false)

// `lhs = value of expr` (a StatusOr), or returns its status if not OK.
// lhs may declare a variable: BATON_ASSIGN_OR_RETURN(auto x, Make());
#define BATON_ASSIGN_OR_RETURN(lhs, expr)                                  \
  BATON_ASSIGN_OR_RETURN_IMPL_(BATON_STATUS_CONCAT_(_baton_or_, __LINE__), \
                               lhs, expr)
#define BATON_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) [[unlikely]]                        \
    return tmp.status();                             \
  lhs = std::move(tmp).value()

#endif  // BATON_COMMON_STATUS_MACROS_H_
