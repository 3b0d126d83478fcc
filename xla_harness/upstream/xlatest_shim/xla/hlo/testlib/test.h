// xla-harness stand-in for xla/hlo/testlib/test.h (not in the tf-nightly wheel):
// gtest and gmock, as the real header exports them.
#ifndef XLA_HARNESS_SHIM_TESTLIB_TEST_H_
#define XLA_HARNESS_SHIM_TESTLIB_TEST_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#endif  // XLA_HARNESS_SHIM_TESTLIB_TEST_H_
