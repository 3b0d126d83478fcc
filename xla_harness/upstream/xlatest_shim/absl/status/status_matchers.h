// xla-harness stand-in for absl/status/status_matchers.h (a test-only Abseil header
// the tf-nightly wheel does not ship): header-only gmock matchers IsOk,
// IsOkAndHolds and StatusIs over absl::Status and absl::StatusOr<T>.
#ifndef XLA_HARNESS_SHIM_ABSL_STATUS_MATCHERS_H_
#define XLA_HARNESS_SHIM_ABSL_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace absl_testing {
namespace xla_harness_internal {
inline const absl::Status& StatusOf(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
}  // namespace xla_harness_internal

MATCHER(IsOk, "is OK") {
  const absl::Status& status = xla_harness_internal::StatusOf(arg);
  *result_listener << "status: " << status;
  return status.ok();
}

MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status: " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

MATCHER_P(StatusIs, code_matcher, "has a matching status code") {
  return ::testing::ExplainMatchResult(
      code_matcher, xla_harness_internal::StatusOf(arg).code(),
      result_listener);
}

MATCHER_P2(StatusIs, code_matcher, message_matcher,
           "has a matching status code and message") {
  const absl::Status& status = xla_harness_internal::StatusOf(arg);
  return ::testing::ExplainMatchResult(code_matcher, status.code(),
                                       result_listener) &&
         ::testing::ExplainMatchResult(message_matcher,
                                       std::string(status.message()),
                                       result_listener);
}

}  // namespace absl_testing

#endif  // XLA_HARNESS_SHIM_ABSL_STATUS_MATCHERS_H_
