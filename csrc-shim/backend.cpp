// The collective entry points of rustccl::Backend (see backend.hpp): each
// builds a Submission (DLPack exports + descriptors), hands it to
// rustccl_submit, and returns a Work whose future the engine completes.
// Groups (split, shrink, monitored barrier) are in groups.cpp, sparse
// all-reduce in sparse.cpp, Work in work.cpp.
#include "backend.hpp"
#include "submission.hpp"
#include "util.hpp"

#include <torch/library.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace rustccl {

// ---------------------------------------------------------------- Backend

Backend::Backend(const RustcclComm* comm, int rank, int size, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), comm_(comm), timeout_(timeout) {
  init();
}

Backend::~Backend() {
  // Joins the engine threads (idempotent after torch's shutdown()).
  rustccl_comm_shutdown(comm_, 0);
  rustccl_comm_release(comm_);
}

std::chrono::milliseconds Backend::effective(std::chrono::milliseconds t) const {
  return t == c10d::kUnsetTimeout ? timeout_ : t;
}

c10::intrusive_ptr<c10d::Work> Backend::finish(Submission& s, std::vector<at::Tensor> result,
                                               std::chrono::milliseconds timeout) {
  // Outside a coalescing block (every plain call): no lock.
  if (!coalescing_.load(std::memory_order_acquire)) return s.submit(std::move(result), timeout);
  std::unique_lock<std::mutex> g(coalescing_mu_);
  if (!coalescing_) {
    g.unlock();
    return s.submit(std::move(result), timeout);
  }
  // Coalescing (batch_isend_irecv, _coalescing_manager): keep the operation
  // for endCoalescing, which submits the whole batch as one unit (one NCCL
  // group for CUDA tensors, without which paired sends and receives could
  // deadlock). Every operation of the batch returns the batch's work.
  if (!batch_) batch_ = std::make_unique<Submission>(*this, "coalesced", c10d::OpType::COALESCED, "rustccl:coalesced");
  batch_->absorb(s);
  batch_result_.insert(batch_result_.end(), result.begin(), result.end());
  if (timeout != c10d::kUnsetTimeout) batch_timeout_ = std::max(batch_timeout_, timeout);
  if (!batch_work_) batch_work_ = batch_->makeWork();
  return batch_work_;
}

void Backend::startCoalescing() {
  std::lock_guard<std::mutex> g(coalescing_mu_);
  TORCH_CHECK(!coalescing_, "rustccl: startCoalescing called twice without endCoalescing");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> Backend::endCoalescing() {
  std::unique_ptr<Submission> batch;
  c10::intrusive_ptr<Work> work;
  std::vector<at::Tensor> result;
  std::chrono::milliseconds timeout{c10d::kUnsetTimeout};
  {
    std::lock_guard<std::mutex> g(coalescing_mu_);
    TORCH_CHECK(coalescing_, "rustccl: endCoalescing called without startCoalescing");
    coalescing_ = false;
    batch.swap(batch_);
    std::swap(work, batch_work_);
    result.swap(batch_result_);
    std::swap(timeout, batch_timeout_);
  }
  if (!batch) return c10::make_intrusive<CoalescedWork>(getRank(), std::vector<c10::intrusive_ptr<c10d::Work>>{});
  return batch->submit(std::move(result), timeout, work);
}

uint64_t Backend::getSequenceNumberForGroup() { return rustccl_comm_seq(comm_); }

void Backend::abort() { rustccl_comm_shutdown(comm_, 1); }

void Backend::shutdown() { rustccl_comm_shutdown(comm_, 0); }

c10::intrusive_ptr<c10d::Work> Backend::broadcast(std::vector<at::Tensor>& tensors,
                                                  const c10d::BroadcastOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  checkOne(tensors, "broadcast");
  Submission s(*this, "broadcast", c10d::OpType::BROADCAST, "rustccl:broadcast");
  s.add(RUSTCCL_BROADCAST, 0, opts.rootRank).inout(tensors[0]);
  s.blocking(!opts.asyncOp);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  checkOne(tensors, "all_reduce");
  // torch sends sparse CPU tensors here and sparse CUDA ones to
  // allreduce_sparse (sparse.cpp).
  if (tensors[0].defined() && tensors[0].layout() == c10::kSparse) return allreduce_sparse(tensors, opts);
  Submission s(*this, "all_reduce", c10d::OpType::ALLREDUCE, "rustccl:all_reduce");
  s.add(RUSTCCL_ALL_REDUCE, engineOp(opts.reduceOp)).inoutScaled(opts.reduceOp, tensors[0], true);
  s.sync(!opts.asyncOp);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "rustccl all_reduce_coalesced: no tensors given");
  Submission s(*this, "all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, "rustccl:all_reduce_coalesced");
  for (auto& t : tensors) checkPremul(opts.reduceOp, t, true, "all_reduce_coalesced");
  s.add(RUSTCCL_ALL_REDUCE, engineOp(opts.reduceOp));
  for (auto& t : tensors) s.inoutScaled(opts.reduceOp, t, true);
  s.blocking(!opts.asyncOp);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  checkOne(tensors, "reduce");
  Submission s(*this, "reduce", c10d::OpType::REDUCE, "rustccl:reduce");
  // Only the root's tensor receives the result: elsewhere a scaled copy
  // goes in and the caller's input keeps its values.
  s.add(RUSTCCL_REDUCE, engineOp(opts.reduceOp), opts.rootRank)
      .inoutScaled(opts.reduceOp, tensors[0], getRank() == opts.rootRank);
  s.blocking(!opts.asyncOp);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  checkOne(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1, "rustccl all_gather: expected one output list, got ", outputs.size());
  Submission s(*this, "all_gather", c10d::OpType::ALLGATHER, "rustccl:all_gather");
  s.add(RUSTCCL_ALL_GATHER).in(inputs[0]).outs(outputs[0]);
  s.blocking(!opts.asyncOp);
  return finish(s, outputs[0], opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                        const c10d::AllgatherOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  Submission s(*this, "all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, "rustccl:all_gather_into_tensor");
  s.add(RUSTCCL_ALL_GATHER).in(input).out(output);
  s.sync(!opts.asyncOp);
  return finish(s, {output}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives input i of rank r.
  TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(), "rustccl all_gather_coalesced: expected ", getSize(),
              " output lists (one per rank), got ", outputs.size());
  for (const auto& l : outputs) {
    TORCH_CHECK(l.size() == inputs.size(), "rustccl all_gather_coalesced: every output list needs ", inputs.size(),
                " tensors, one per input");
  }
  Submission s(*this, "all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, "rustccl:all_gather_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) {
    s.add(RUSTCCL_ALL_GATHER).in(inputs[i]);
    for (auto& l : outputs) s.out(l[i]);
  }
  s.blocking(!opts.asyncOp);
  return finish(s, flatten(outputs), opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                        std::vector<at::Tensor>& inputs,
                                                                        const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "rustccl all_gather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  Submission s(*this, "all_gather_into_tensor_coalesced", c10d::OpType::COALESCED,
               "rustccl:all_gather_into_tensor_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) s.add(RUSTCCL_ALL_GATHER).in(inputs[i]).out(outputs[i]);
  s.blocking(!opts.asyncOp);
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  checkOne(inputs, "gather");
  Submission s(*this, "gather", c10d::OpType::GATHER, "rustccl:gather");
  s.add(RUSTCCL_GATHER, 0, opts.rootRank).in(inputs[0]);
  std::vector<at::Tensor> result;
  if (getRank() == opts.rootRank) {
    TORCH_CHECK(outputs.size() == 1, "rustccl gather: the root needs one output list, got ", outputs.size());
    s.outs(outputs[0]);
    result = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "rustccl gather: only the root (rank ",
                opts.rootRank, ") passes a gather list");
  }
  s.blocking(!opts.asyncOp);
  return finish(s, result, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ScatterOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  checkOne(outputs, "scatter");
  Submission s(*this, "scatter", c10d::OpType::SCATTER, "rustccl:scatter");
  s.add(RUSTCCL_SCATTER, 0, opts.rootRank);
  if (getRank() == opts.rootRank) {
    TORCH_CHECK(inputs.size() == 1, "rustccl scatter: the root needs one scatter list, got ", inputs.size());
    s.ins(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "rustccl scatter: only the root (rank ",
                opts.rootRank, ") passes a scatter list");
  }
  s.out(outputs[0]);
  s.blocking(!opts.asyncOp);
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ReduceScatterOptions& opts) {
  checkOne(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "rustccl reduce_scatter: expected one input list, got ", inputs.size());
  Submission s(*this, "reduce_scatter", c10d::OpType::REDUCE_SCATTER, "rustccl:reduce_scatter");
  for (const auto& t : inputs[0]) checkPremul(opts.reduceOp, t, false, "reduce_scatter");
  s.add(RUSTCCL_REDUCE_SCATTER, engineOp(opts.reduceOp));
  for (const auto& t : inputs[0]) s.inScaled(opts.reduceOp, t);
  s.out(outputs[0]);
  s.blocking(!opts.asyncOp);
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::ReduceScatterOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  Submission s(*this, "reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, "rustccl:reduce_scatter_tensor");
  s.add(RUSTCCL_REDUCE_SCATTER, engineOp(opts.reduceOp)).inScaled(opts.reduceOp, input).out(output);
  s.sync(!opts.asyncOp);
  return finish(s, {output}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                        std::vector<at::Tensor>& inputs,
                                                                        const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "rustccl reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  Submission s(*this, "reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED,
               "rustccl:reduce_scatter_tensor_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) {
    s.add(RUSTCCL_REDUCE_SCATTER, engineOp(opts.reduceOp)).inScaled(opts.reduceOp, inputs[i]).out(outputs[i]);
  }
  s.blocking(!opts.asyncOp);
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                      std::vector<int64_t>& output_splits,
                                                      std::vector<int64_t>& input_splits,
                                                      const c10d::AllToAllOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  Submission s(*this, "all_to_all_single", c10d::OpType::ALLTOALL_BASE, "rustccl:all_to_all_single");
  s.add(RUSTCCL_ALL_TO_ALL).splits(input_splits, output_splits).in(input).out(output);
  s.blocking(!opts.asyncOp);
  return finish(s, {output}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                 const c10d::AllToAllOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  Submission s(*this, "all_to_all", c10d::OpType::ALLTOALL, "rustccl:all_to_all");
  s.add(RUSTCCL_ALL_TO_ALL).ins(inputs).outs(outputs);
  s.blocking(!opts.asyncOp);
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM_P2P);
  checkOne(tensors, "send");
  Submission s(*this, "send", c10d::OpType::SEND, "rustccl:send");
  s.add(RUSTCCL_SEND, 0, dst, tag).in(tensors[0]);
  return finish(s, tensors, c10d::kUnsetTimeout);
}

c10::intrusive_ptr<c10d::Work> Backend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM_P2P);
  checkOne(tensors, "recv");
  Submission s(*this, "recv", c10d::OpType::RECV, "rustccl:recv");
  s.add(RUSTCCL_RECV, 0, src, tag).out(tensors[0]);
  return finish(s, tensors, c10d::kUnsetTimeout);
}

c10::intrusive_ptr<c10d::Work> Backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM_P2P);
  checkOne(tensors, "recv");
  Submission s(*this, "recv", c10d::OpType::RECVANYSOURCE, "rustccl:recv");
  s.add(RUSTCCL_RECV, 0, -1, tag).out(tensors[0]);
  return finish(s, tensors, c10d::kUnsetTimeout);
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(const c10d::BarrierOptions& opts) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM);
  Submission s(*this, "barrier", c10d::OpType::BARRIER, "rustccl:barrier");
  s.add(RUSTCCL_BARRIER);
  s.blocking(!opts.asyncOp);
  return finish(s, {}, opts.timeout);
}

// ------------------------------------------------------------ registration

namespace {

// Wraps a communicator handle from Python (`Communicator._into_raw()`) in
// a Backend, registered for CPU and CUDA in a ProcessGroup so that Python
// can unbox it and take the Backend out.
c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroup(int64_t comm, int64_t rank, int64_t size,
                                                          int64_t timeout_ms) {
  TORCH_CHECK(comm != 0, "rustccl: null communicator handle");
  auto backend = c10::make_intrusive<Backend>(reinterpret_cast<const RustcclComm*>(comm), static_cast<int>(rank),
                                              static_cast<int>(size), std::chrono::milliseconds(timeout_ms));
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(static_cast<int>(rank), static_cast<int>(size));
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return pg;
}

}  // namespace
}  // namespace rustccl

TORCH_LIBRARY(rustccl, m) {
  m.def(
      "_create_process_group(int comm, int rank, int size, int timeout_ms) -> "
      "__torch__.torch.classes.c10d.ProcessGroup",
      &rustccl::createProcessGroup);
}
