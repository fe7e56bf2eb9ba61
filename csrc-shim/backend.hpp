// The c10d::Backend and c10d::Work subclasses that put rustccl behind
// torch.distributed. They hold no algorithm: they check what only torch can
// see (layouts, devices), hand tensors to the Rust engine as DLPack, and turn
// its completions into c10 futures and exceptions.
//
// Device-generic: CUDA streams are reached through c10's DeviceGuardImpl
// interface, so this file links only c10 and torch_cpu.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rustccl.h"

namespace rustccl {

class Backend;
class Submission;

// Tensors rustccl could not use in place (non-contiguous, misaligned): the
// engine works on a contiguous copy, copied back into the caller's tensor
// before the work completes (for CUDA: on the comm stream, right after the
// collective).
struct Staging {
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (caller's, staged)
  std::vector<at::Tensor> temps;  // input copies the engine reads (contiguous or PREMUL_SUM-scaled)
  void finish();
  void absorb(Staging& o);  // takes over o's tensors
};

class Work : public c10d::Work {
 public:
  // `title` and `profiled` go to c10d::Work's profiler event (pass nullptr /
  // nullopt while no RecordFunction callback is registered).
  Work(int rank, c10d::OpType type, const char* title, const std::optional<std::vector<at::Tensor>>& profiled,
       std::optional<c10::Device> device);
  ~Work() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // What the future yields, and what to copy back; set before submission.
  void adopt(std::vector<at::Tensor> outputs, Staging staging);
  // After a successful submission.
  void submitted(::RustcclWork* handle);
  // Called by the engine, once, on its thread.
  static void onDone(void* ctx, int32_t status, const char* message, int32_t source_rank);

 private:
  void throwIfDeviceError();
  // CUDA: makes the current stream wait for the work.
  void orderCurrentStream();
  // CUDA: completes `f` with the stream the work ran on current, so that
  // its events follow the collective (and any copy back).
  void completeOnDevice(const c10::intrusive_ptr<c10::ivalue::Future>& f);

  ::RustcclWork* handle_ = nullptr;
  std::optional<c10::Device> device_;  // set for CUDA work
  std::vector<at::Tensor> outputs_;
  Staging staging_;
  std::atomic<int> source_rank_{-1};
  // CUDA work: made on the first getFuture() (or at submission when outputs
  // are copied back): completing a CUDA future creates and records an event,
  // which a plain `dist.all_reduce` never looks at. Guarded by future_mu_.
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex future_mu_;
  bool submitted_ = false;  // CUDA: handed to the engine (under future_mu_)
  int ran_on_device_ = -1;  // CUDA: the device the engine ran it on (-1: through host memory)
  uint64_t ran_on_ = 0;     // CUDA: the stream it ran on
  mutable std::mutex error_mu_;
  std::exception_ptr device_error_;  // CUDA work that failed after its future completed
  bool staged_ = false;              // outputs are copied back after the collective
};

// Several works as one (kept for batches torch hands us already split).
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class Backend : public c10d::Backend {
 public:
  Backend(const RustcclComm* comm, int rank, int size, std::chrono::milliseconds timeout);
  ~Backend() override;

  const std::string getBackendName() const override { return "rustccl"; }
  bool supportsCoalescing() const override { return true; }
  bool supportsSplitting() const override { return true; }
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setSequenceNumberForGroup() override {}
  void setGroupUid(const std::string& pg_uid) override {
    c10d::Backend::setGroupUid(pg_uid);
    rustccl_comm_set_name(comm_, pg_uid.c_str());
  }
  uint64_t getSequenceNumberForGroup() override;
  void abort() override;
  void shutdown() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // groups.cpp: new groups from this one, and gloo's monitored barrier.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  void eagerConnectSingleDevice(at::Device device) override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts_override) override;

  const RustcclComm* comm() const { return comm_; }
  std::chrono::milliseconds effective(std::chrono::milliseconds t) const;

 private:
  // Submits `s`, or adds it to the open coalescing batch.
  c10::intrusive_ptr<c10d::Work> finish(Submission& s, std::vector<at::Tensor> result,
                                        std::chrono::milliseconds timeout);

  const RustcclComm* comm_;
  std::chrono::milliseconds timeout_;
  std::mutex coalescing_mu_;
  std::atomic<bool> coalescing_{false};  // written under coalescing_mu_
  std::unique_ptr<Submission> batch_;
  c10::intrusive_ptr<Work> batch_work_;
  std::vector<at::Tensor> batch_result_;
  std::chrono::milliseconds batch_timeout_{c10d::kUnsetTimeout};
  // split(): torch calls it once per device type of the parent group (CPU
  // and CUDA share this backend); the second call returns the first's
  // result, by group name. Non-members map to an empty pointer.
  std::mutex splits_mu_;
  std::map<std::string, c10::weak_intrusive_ptr<c10d::Backend>> splits_;
};

}  // namespace rustccl
