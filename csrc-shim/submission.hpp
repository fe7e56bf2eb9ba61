// One call into the engine: DLPack exports and operation descriptors,
// staging of tensors the engine cannot use in place, PREMUL_SUM scaling.
#pragma once

#include <ATen/DLConvertor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include "backend.hpp"
#include "util.hpp"

namespace rustccl {

// One call into the engine: any number of operations submitted as one work.
class Submission {
 public:
  Submission(Backend& b, const char* op, c10d::OpType type, const char* title)
      : b_(b), op_(op), type_(type), title_(title) {}
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;

  ~Submission() {
    if (handed_) return;
    for (auto& o : ops_) {
      for (auto* t : o.ins) t->deleter(t);
      for (auto* t : o.outs) t->deleter(t);
    }
  }

  // Starts a new operation of this submission.
  Submission& add(int32_t kind, int32_t reduce_op = 0, int64_t root = 0, int64_t tag = 0) {
    ops_.push_back(Op{kind, reduce_op, root, tag, {}, {}, {}, {}});
    return *this;
  }
  Submission& splits(std::vector<int64_t> in, std::vector<int64_t> out) {
    ops_.back().in_splits = std::move(in);
    ops_.back().out_splits = std::move(out);
    return *this;
  }

  // A tensor the engine only reads.
  Submission& in(const at::Tensor& t) {
    checkTensor(t, op_);
    noteDevice(t);
    profiled_.push_back(t);
    if (!needsStaging(t)) {
      ops_.back().ins.push_back(exportTensor(t));
      return *this;
    }
    return inTemp(t.contiguous());
  }

  // PREMUL_SUM: a scaled copy of `t` (`t` itself for other ops).
  Submission& inScaled(const c10d::ReduceOp& op, const at::Tensor& t) {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return in(t);
    noteDevice(t);
    profiled_.push_back(t);
    return inTemp(premultiplied(op, t, false, op_));
  }

  // A tensor the engine reads and writes in place, scaled first for
  // PREMUL_SUM: in place where the result overwrites it anyway
  // (`overwritten`), else through a scaled copy that leaves `t` as it was.
  Submission& inoutScaled(const c10d::ReduceOp& op, const at::Tensor& t, bool overwritten) {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return inout(t);
    if (overwritten) return inout(premultiplied(op, t, true, op_));
    at::Tensor scaled = premultiplied(op, t, false, op_);
    staging_.temps.push_back(scaled);
    return inout(scaled);
  }

  // torch's asyncOp=false: the caller waits for the work at once.
  Submission& sync(bool s) {
    sync_ = s;
    return *this;
  }

  // torch's asyncOp=false on CPU tensors (call after adding them): the
  // caller waits at once, so the engine leaves the collective to the
  // waiting thread for a moment. CUDA calls are marked only through `sync`.
  Submission& blocking(bool b) {
    if (b && !(device_ && device_->is_cuda())) sync_ = true;
    return *this;
  }

  // A tensor the engine writes.
  Submission& out(const at::Tensor& t) {
    ops_.back().outs.push_back(exportTensor(writable(t, false)));
    return *this;
  }

  // A tensor the engine reads and writes in place (all_reduce, broadcast).
  Submission& inout(const at::Tensor& t) {
    profiled_.push_back(t);
    ops_.back().ins.push_back(exportTensor(writable(t, true)));
    return *this;
  }

  Submission& ins(const std::vector<at::Tensor>& v) {
    for (const auto& t : v) in(t);
    return *this;
  }
  Submission& outs(const std::vector<at::Tensor>& v) {
    for (const auto& t : v) out(t);
    return *this;
  }

  // Takes over the operations of `o` (a coalescing batch).
  void absorb(Submission& o) {
    for (auto& op : o.ops_) ops_.push_back(std::move(op));
    o.ops_.clear();
    profiled_.insert(profiled_.end(), o.profiled_.begin(), o.profiled_.end());
    staging_.absorb(o.staging_);
    if (!device_) {
      device_ = o.device_;
      stream_ = o.stream_;
    }
  }

  c10::intrusive_ptr<Work> makeWork() const {
    std::optional<c10::Device> cuda;
    if (device_ && device_->is_cuda()) cuda = device_;
    // c10d::Work makes a profiler event only while some RecordFunction
    // callback is registered; without one, skip building its arguments.
    if (!at::hasCallbacks()) return c10::make_intrusive<Work>(b_.getRank(), type_, nullptr, std::nullopt, cuda);
    std::vector<at::Tensor> profiled(profiled_.begin(), profiled_.end());
    return c10::make_intrusive<Work>(b_.getRank(), type_, title_, profiled, cuda);
  }

  // Hands everything to the engine; `result` is what the future yields.
  c10::intrusive_ptr<c10d::Work> submit(std::vector<at::Tensor> result, std::chrono::milliseconds timeout,
                                        c10::intrusive_ptr<Work> work = {}) {
    if (!work) work = makeWork();
    work->adopt(std::move(result), std::move(staging_));
    c10::SmallVector<RustcclOpDesc, 1> descs;
    descs.reserve(ops_.size());
    for (auto& o : ops_) {
      RustcclOpDesc d{};
      d.kind = o.kind;
      d.reduce_op = o.reduce_op;
      d.root = o.root;
      d.tag = o.tag;
      d.inputs = o.ins.data();
      d.n_inputs = o.ins.size();
      d.outputs = o.outs.data();
      d.n_outputs = o.outs.size();
      d.in_splits = o.in_splits.data();
      d.n_in_splits = o.in_splits.size();
      d.out_splits = o.out_splits.data();
      d.n_out_splits = o.out_splits.size();
      d.stream = stream_;
      d.flags = sync_ ? RUSTCCL_OP_SYNC : 0u;
      descs.push_back(d);
    }
    // The context is a reference to the work, keeping it alive until the
    // engine is done with it (Work::onDone takes it back).
    void* ctx = c10::intrusive_ptr<Work>(work).release();
    ::RustcclWork* handle = nullptr;
    handed_ = true;  // the engine owns every export from here on
    int32_t rc = rustccl_submit(b_.comm(), descs.data(), descs.size(), b_.effective(timeout).count(), &Work::onDone,
                                ctx, &handle);
    if (rc != RUSTCCL_OK) {
      (void)c10::intrusive_ptr<Work>::reclaim(static_cast<Work*>(ctx));  // the engine never calls done
      throwStatus(rc, rustccl_last_error());
    }
    work->submitted(handle);
    return work;
  }

 private:
  struct Op {
    int32_t kind;
    int32_t reduce_op;
    int64_t root;
    int64_t tag;
    c10::SmallVector<DLManagedTensor*, 1> ins;
    c10::SmallVector<DLManagedTensor*, 1> outs;
    std::vector<int64_t> in_splits;
    std::vector<int64_t> out_splits;
  };

  void noteDevice(const at::Tensor& t) {
    if (device_) return;
    device_ = t.device();
    if (t.is_cuda()) stream_ = currentStream(t.device());
  }

  // The tensor the engine may write for `t`: `t` itself, or a contiguous
  // copy (with `t`'s data if `keep`) copied back on completion.
  at::Tensor writable(const at::Tensor& t, bool keep) {
    checkTensor(t, op_);
    noteDevice(t);
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "rustccl ", op_,
                ": an output tensor has elements that share memory (e.g. an expanded tensor)");
    if (!needsStaging(t)) return t;
    at::Tensor staged =
        keep ? t.contiguous() : at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
    staging_.copy_back.emplace_back(t, staged);
    return staged;
  }

  // A copy made for the engine to read: kept, and for CUDA work recorded on
  // rustccl's stream, until the collective is done with it.
  Submission& inTemp(const at::Tensor& copy) {
    staging_.temps.push_back(copy);
    ops_.back().ins.push_back(exportTensor(copy));
    return *this;
  }

  DLManagedTensor* exportTensor(const at::Tensor& t) {
    try {
      return at::toDLPack(t);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "rustccl ", op_, ": cannot pass a ", t.scalar_type(),
                  " tensor to the engine: ", e.what_without_backtrace());
    }
  }

  Backend& b_;
  const char* op_;
  c10d::OpType type_;
  const char* title_;
  c10::SmallVector<Op, 1> ops_;  // one for every call but the coalesced ones
  c10::SmallVector<at::Tensor, 2> profiled_;
  Staging staging_;
  std::optional<c10::Device> device_;
  uint64_t stream_ = 0;
  bool handed_ = false;
  bool sync_ = false;
};

}  // namespace rustccl
