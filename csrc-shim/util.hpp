// Helpers shared by the shim's files (util.cpp): status codes to c10
// exceptions, what only torch can check about a tensor, PREMUL_SUM scaling,
// and raw stream handles through c10's device-generic interface.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "rustccl.h"

namespace rustccl {

// An engine status as the c10 exception users catch (DistBackendError,
// DistNetworkError, or a plain c10::Error for bad input).
[[noreturn]] void throwStatus(int32_t status, const std::string& msg);
std::exception_ptr makeException(int32_t status, const std::string& msg);

c10::TypePtr tensorListType();

// What only torch can see: layout, device, dtype family.
void checkTensor(const at::Tensor& t, const char* op);
// Non-contiguous or misaligned: the engine works on a contiguous copy.
bool needsStaging(const at::Tensor& t);
void checkOne(const std::vector<at::Tensor>& v, const char* op);

// PREMUL_SUM runs as SUM over scaled inputs; every other op as itself.
int32_t engineOp(const c10d::ReduceOp& op);
// Everything that would stop a PREMUL_SUM collective, before any scaling.
void checkPremul(const c10d::ReduceOp& op, const at::Tensor& t, bool in_place, const char* name);
// `t` scaled by PREMUL_SUM's factor (in place or as a copy); `t` for other ops.
at::Tensor premultiplied(const c10d::ReduceOp& op, const at::Tensor& t, bool in_place, const char* name);

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& v);

// Adds the time until it is dropped to a host-profile span (only with
// RUSTCCL_HOST_PROFILE=1; otherwise one cached branch).
class ProfileSpan {
 public:
  explicit ProfileSpan(int32_t span) : span_(span) {
    static const bool on = rustccl_host_profile_enabled() != 0;
    if (on) t0_ = std::chrono::steady_clock::now();
    on_ = on;
  }
  ~ProfileSpan() {
    if (!on_) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
    rustccl_host_profile_add(span_, static_cast<uint64_t>(ns));
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;

 private:
  int32_t span_;
  bool on_ = false;
  std::chrono::steady_clock::time_point t0_;
};

// The caller's current stream on `d`, as a raw handle (CUDA only).
uint64_t currentStream(const c10::Device& d);
// c10::Stream for a stream rustccl created (c10 names foreign CUDA streams
// by their handle).
c10::Stream externalStream(const c10::Device& d, uint64_t handle);

}  // namespace rustccl
