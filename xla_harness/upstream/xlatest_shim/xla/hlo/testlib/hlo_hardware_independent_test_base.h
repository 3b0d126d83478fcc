// xla-harness stand-in for xla/hlo/testlib/hlo_hardware_independent_test_base.h,
// which the tf-nightly wheel does not ship. It offers the part of the real fixture
// that XLA's pass unit tests use: ParseAndReturnVerifiedModule (parser + HloVerifier
// with the real base's defaults: layout-insensitive, mixed precision allowed),
// CreateNewVerifiedModule, TestName and FindInstruction; and the ASSERT_OK / EXPECT_OK /
// ASSERT_OK_AND_ASSIGN macros that XLA's googletest carries and Debian's lacks.
#ifndef XLA_HARNESS_SHIM_HLO_HARDWARE_INDEPENDENT_TEST_BASE_H_
#define XLA_HARNESS_SHIM_HLO_HARDWARE_INDEPENDENT_TEST_BASE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/status_matchers.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "xla/hlo/ir/hlo_computation.h"
#include "xla/hlo/ir/hlo_instruction.h"
#include "xla/hlo/ir/hlo_module.h"
#include "xla/hlo/parser/hlo_parser.h"
#include "xla/service/hlo_module_config.h"
#include "xla/service/hlo_verifier.h"

#define XLA_HARNESS_CAT_(a, b) a##b
#define XLA_HARNESS_CAT(a, b) XLA_HARNESS_CAT_(a, b)

#ifndef ASSERT_OK
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::absl_testing::IsOk())
#endif
#ifndef EXPECT_OK
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::absl_testing::IsOk())
#endif
#ifndef ASSERT_OK_AND_ASSIGN
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  XLA_HARNESS_ASSIGN_(XLA_HARNESS_CAT(xla_harness_or_, __COUNTER__), lhs, rexpr)
#define XLA_HARNESS_ASSIGN_(holder, lhs, rexpr)       \
  auto holder = (rexpr);                              \
  ASSERT_TRUE(holder.ok()) << holder.status();        \
  lhs = std::move(holder).value()
#endif

namespace xla {

class HloHardwareIndependentTestBase : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<HloModule>> ParseAndReturnVerifiedModule(
      absl::string_view hlo_text) {
    absl::StatusOr<std::unique_ptr<HloModule>> module =
        ParseAndReturnUnverifiedModule(hlo_text, HloModuleConfig());
    if (!module.ok()) return module.status();
    absl::Status verified = Verify(module->get());
    if (!verified.ok()) return verified;
    return module;
  }

  static std::string TestName() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::unique_ptr<HloModule> CreateNewVerifiedModule(
      const std::string& name = TestName()) {
    return std::make_unique<HloModule>(name, HloModuleConfig());
  }

  static absl::Status Verify(HloModule* module) {
    HloVerifier verifier(/*layout_sensitive=*/false,
                         /*allow_mixed_precision=*/true);
    return verifier.Run(module).status();
  }

  static HloInstruction* FindInstruction(HloModule* module,
                                         absl::string_view name) {
    for (HloComputation* computation : module->computations()) {
      for (HloInstruction* instruction : computation->instructions()) {
        if (instruction->name() == name) return instruction;
      }
    }
    return nullptr;
  }
};

}  // namespace xla

#endif  // XLA_HARNESS_SHIM_HLO_HARDWARE_INDEPENDENT_TEST_BASE_H_
