// Ops HarnessSqrtGrad, HarnessRsqrtGrad and HarnessReciprocalGrad: the same signature as
// TensorFlow's SqrtGrad, RsqrtGrad and ReciprocalGrad (y, dy -> z), with the tf2xla
// lowerings of patches/tensorflow/0001. The lowerings are not restated here: build.py
// writes the new text of the patch's hunks of tensorflow/compiler/tf2xla/kernels/
// binary_ops.cc into patched_lowerings.inc, renaming only the ops, so the compiled code is
// the patch's code. The control build (build.py --side stock) writes the hunks' old text,
// TF's stock lowerings, and sets HARNESS_OP_PREFIX to "HarnessStock". Built against the installed TF wheel's headers and loaded with tf.load_op_library.
// No CPU/GPU kernel is registered: the ops run only under jit_compile=True.

#include "tensorflow/compiler/tf2xla/kernels/cwise_ops.h"
#include "tensorflow/compiler/tf2xla/xla_helpers.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "xla/hlo/builder/lib/constants.h"
#include "xla/hlo/builder/xla_builder.h"

namespace tensorflow {

#define HARNESS_GRAD_OP(NAME)                                                 \
  REGISTER_OP(NAME)                                                           \
      .Input("y: T")                                                          \
      .Input("dy: T")                                                         \
      .Output("z: T")                                                         \
      .Attr("T: {half, bfloat16, float, double, complex64, complex128}")      \
      .SetShapeFn(shape_inference::MergeBothInputsShapeFn)

#ifndef HARNESS_OP_PREFIX
#define HARNESS_OP_PREFIX "Harness"
#endif

HARNESS_GRAD_OP(HARNESS_OP_PREFIX "SqrtGrad");
HARNESS_GRAD_OP(HARNESS_OP_PREFIX "RsqrtGrad");
HARNESS_GRAD_OP(HARNESS_OP_PREFIX "ReciprocalGrad");

namespace {

// The shape of binary_ops.cc's helper macro, for the generated lines below.
#define XLA_MAKE_BINARY(NAME, HLO)                                            \
  class NAME##Op : public XlaBinaryOp {                                       \
   public:                                                                    \
    explicit NAME##Op(OpKernelConstruction* ctx) : XlaBinaryOp(ctx) {}        \
    xla::XlaOp Computation(XlaOpKernelContext* ctx, const xla::XlaOp& lhs,    \
                           const absl::Span<const int64_t>& lhs_shape,        \
                           const xla::XlaOp& rhs,                             \
                           const absl::Span<const int64_t>& rhs_shape,        \
                           const BCast& broadcast_helper,                     \
                           const std::vector<int64_t>& extend_dimensions)     \
        override {                                                            \
      xla::XlaBuilder* b = ctx->builder();                                    \
      (void)b;                                                                \
      (void)lhs_shape;                                                        \
      (void)rhs_shape;                                                        \
      (void)broadcast_helper;                                                 \
      (void)extend_dimensions;                                                \
      return HLO;                                                             \
    }                                                                         \
  };                                                                          \
  REGISTER_XLA_OP(Name(#NAME), NAME##Op)

#include "patched_lowerings.inc"

#undef XLA_MAKE_BINARY

}  // namespace
}  // namespace tensorflow
