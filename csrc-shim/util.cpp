// Helpers shared by the shim's files: errors, tensor checks, PREMUL_SUM
// scaling, streams. Declared in util.hpp.
#include "util.hpp"

#include <ATen/MemoryOverlap.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace rustccl {

[[noreturn]] void throwStatus(int32_t status, const std::string& msg) {
  switch (status) {
    case RUSTCCL_TIMEOUT:
    case RUSTCCL_BACKEND:
    case RUSTCCL_WAIT_TIMEOUT:
      C10_THROW_ERROR(DistBackendError, msg);
    case RUSTCCL_NETWORK:
      C10_THROW_ERROR(DistNetworkError, msg);
    default:
      TORCH_CHECK(false, msg);
  }
}

std::exception_ptr makeException(int32_t status, const std::string& msg) {
  try {
    throwStatus(status, msg);
  } catch (...) {
    return std::current_exception();
  }
}

c10::TypePtr tensorListType() { return c10::ListType::create(c10::TensorType::get()); }

static bool isSupportedDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kBool:
    case at::kUInt16:
    case at::kUInt32:
    case at::kUInt64:
    case at::kComplexHalf:
    case at::kComplexFloat:
    case at::kComplexDouble:
    case at::kFloat8_e5m2:
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2fnuz:
    case at::kFloat8_e4m3fnuz:
      return true;
    default:
      return false;
  }
}

// What only torch can see: layout, device, dtype family.
void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "rustccl ", op, ": got an undefined tensor");
  TORCH_CHECK(t.layout() == c10::kStrided, "rustccl ", op, ": ", t.layout(),
              " tensors are not supported; only dense (strided) tensors are (and sparse COO ones by all_reduce)");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "rustccl ", op, ": tensors on device ", t.device(),
              " are not supported (cpu and cuda only)");
  TORCH_CHECK(!t.is_quantized(), "rustccl ", op, ": quantized tensors are not supported");
  TORCH_CHECK(isSupportedDtype(t.scalar_type()), "rustccl ", op, ": dtype ", t.scalar_type(), " is not supported");
}

bool needsStaging(const at::Tensor& t) {
  if (!t.is_contiguous()) return true;
  if (t.numel() == 0) return false;
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size() != 0;
}

void checkOne(const std::vector<at::Tensor>& v, const char* op) {
  TORCH_CHECK(v.size() == 1, "rustccl ", op, ": expected exactly one tensor, got ", v.size(),
              " (one tensor per process)");
}

// torch's PREMUL_SUM (dist._make_nccl_premul_sum(factor)): every rank
// scales its input by its own factor, then the inputs are summed. The shim
// scales (with ATen, on the caller's stream for CUDA tensors) and the engine
// sums, so every transport and algorithm serves it.
int32_t engineOp(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::PREMUL_SUM ? static_cast<int32_t>(c10d::ReduceOp::SUM) : op.op_;
}

// Everything that would stop a PREMUL_SUM collective, checked before any
// tensor is scaled (a coalesced call checks all of its tensors first).
void checkPremul(const c10d::ReduceOp& op, const at::Tensor& t, bool in_place, const char* name) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return;
  TORCH_CHECK(op.supplement_, "rustccl ", name,
              ": PREMUL_SUM without a factor (make the op with "
              "torch.distributed._make_nccl_premul_sum)");
  checkTensor(t, name);
  auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16, "rustccl ", name,
              ": PREMUL_SUM needs float32/float64/float16/bfloat16 tensors, got ", st);
  TORCH_CHECK(!in_place || at::has_internal_overlap(t) != at::MemOverlap::Yes, "rustccl ", name,
              ": an output tensor has elements that share memory (e.g. an expanded tensor)");
}

// `t` scaled by PREMUL_SUM's factor (any other op: `t` itself). `in_place`
// when the collective overwrites `t` anyway; otherwise a scaled copy, so the
// caller's input keeps its values. Outside autograd, as the collective is.
at::Tensor premultiplied(const c10d::ReduceOp& op, const at::Tensor& t, bool in_place, const char* name) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return t;
  checkPremul(op, t, in_place, name);
  // PREMUL_SUM always carries this supplement (torch's makeNCCLPreMulSum);
  // ProcessGroupNCCL casts the same way.
  const auto& sup = *static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  at::NoGradGuard no_grad;
  const at::Tensor& tf = sup.tensor_factor;
  if (tf.defined() && tf.device() != t.device() && tf.device().is_cpu()) {
    // A host factor for a device tensor: as a number, no copy to the device
    // (which CUDA graph capture would refuse).
    double f = tf.item<double>();
    return in_place ? t.mul_(f) : t.mul(f);
  }
  if (tf.defined()) {
    // As a 0-dim tensor of t's device and type: scales without changing
    // t's shape (the factor is a one-element tensor of any shape).
    at::Tensor f = tf.reshape({}).to(t.device(), t.scalar_type());
    return in_place ? t.mul_(f) : t.mul(f);
  }
  return in_place ? t.mul_(sup.double_factor) : t.mul(sup.double_factor);
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& v) {
  std::vector<at::Tensor> out;
  for (const auto& l : v) out.insert(out.end(), l.begin(), l.end());
  return out;
}

// The caller's current stream on `d`, as a raw handle (CUDA only).
uint64_t currentStream(const c10::Device& d) {
  c10::impl::VirtualGuardImpl impl(d.type());
  return reinterpret_cast<uint64_t>(impl.getStream(d).native_handle());
}

// c10::Stream for a stream rustccl created. For CUDA, c10 identifies an
// external stream by its handle ("StreamId is the cudaStream_t pointer"),
// which is how torch wraps foreign streams too.
c10::Stream externalStream(const c10::Device& d, uint64_t handle) {
  return c10::Stream(c10::Stream::UNSAFE, d, static_cast<c10::StreamId>(handle));
}

}  // namespace rustccl
