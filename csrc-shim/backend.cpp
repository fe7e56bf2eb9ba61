// See backend.hpp. Every collective builds a Submission (DLPack exports +
// descriptors), hands it to rustccl_submit, and returns a Work whose future
// the engine completes through Work::onDone.
#include "backend.hpp"

#include <ATen/DLConvertor.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

namespace rustccl {
namespace {

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

bool isSupportedDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
    case at::kUInt16: case at::kUInt32: case at::kUInt64:
    case at::kComplexHalf: case at::kComplexFloat: case at::kComplexDouble:
    case at::kFloat8_e5m2: case at::kFloat8_e4m3fn: case at::kFloat8_e5m2fnuz: case at::kFloat8_e4m3fnuz:
      return true;
    default:
      return false;
  }
}

// What only torch can see: layout, device, dtype family.
void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "rustccl ", op, ": got an undefined tensor");
  TORCH_CHECK(t.layout() == c10::kStrided, "rustccl ", op, ": ", t.layout(),
              " tensors are not supported; only dense (strided) tensors are");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "rustccl ", op, ": tensors on device ",
              t.device(), " are not supported (cpu and cuda only)");
  TORCH_CHECK(!t.is_quantized(), "rustccl ", op, ": quantized tensors are not supported");
  TORCH_CHECK(isSupportedDtype(t.scalar_type()), "rustccl ", op, ": dtype ", t.scalar_type(),
              " is not supported");
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
  TORCH_CHECK(op.supplement_, "rustccl ", name, ": PREMUL_SUM without a factor (make the op with "
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

}  // namespace

void Staging::finish() {
  for (auto& [user, staged] : copy_back) user.copy_(staged);
}

void Staging::absorb(Staging& o) {
  for (auto& p : o.copy_back) copy_back.push_back(std::move(p));
  for (auto& t : o.temps) temps.push_back(std::move(t));
  o.copy_back.clear();
  o.temps.clear();
}

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
    return c10::make_intrusive<Work>(b_.getRank(), type_, title_, profiled_, cuda);
  }

  // Hands everything to the engine; `result` is what the future yields.
  c10::intrusive_ptr<c10d::Work> submit(std::vector<at::Tensor> result, std::chrono::milliseconds timeout,
                                        c10::intrusive_ptr<Work> work = {}) {
    if (!work) work = makeWork();
    work->adopt(std::move(result), std::move(staging_));
    std::vector<RustcclOpDesc> descs;
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
    // The context keeps the work alive until the engine is done with it.
    auto* ctx = new c10::intrusive_ptr<Work>(work);
    ::RustcclWork* handle = nullptr;
    handed_ = true;  // the engine owns every export from here on
    int32_t rc = rustccl_submit(b_.comm(), descs.data(), descs.size(), b_.effective(timeout).count(),
                                &Work::onDone, ctx, &handle);
    if (rc != RUSTCCL_OK) {
      delete ctx;
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
    std::vector<DLManagedTensor*> ins;
    std::vector<DLManagedTensor*> outs;
    std::vector<int64_t> in_splits;
    std::vector<int64_t> out_splits;
  };

  bool sync_ = false;

 public:
  // torch's asyncOp=false: the caller waits for the work at once.
  Submission& sync(bool s) {
    sync_ = s;
    return *this;
  }

 private:
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
      TORCH_CHECK(false, "rustccl ", op_, ": cannot pass a ", t.scalar_type(), " tensor to the engine: ",
                  e.what_without_backtrace());
    }
  }

  Backend& b_;
  const char* op_;
  c10d::OpType type_;
  const char* title_;
  std::vector<Op> ops_;
  std::vector<at::Tensor> profiled_;
  Staging staging_;
  std::optional<c10::Device> device_;
  uint64_t stream_ = 0;
  bool handed_ = false;
};

// ------------------------------------------------------------------ Work

Work::Work(int rank, c10d::OpType type, const char* title, const std::vector<at::Tensor>& profiled,
           std::optional<c10::Device> device)
    : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(profiled)),
      device_(device),
      future_(device ? c10::make_intrusive<c10::ivalue::Future>(tensorListType(), std::vector<c10::Device>{*device})
                     : c10::make_intrusive<c10::ivalue::Future>(tensorListType())) {}

Work::~Work() {
  if (handle_ != nullptr) rustccl_work_release(handle_);
}

void Work::adopt(std::vector<at::Tensor> outputs, Staging staging) {
  outputs_.insert(outputs_.end(), outputs.begin(), outputs.end());
  staged_ = staged_ || !staging.copy_back.empty();
  staging_.absorb(staging);
}

void Work::submitted(::RustcclWork* h) {
  handle_ = h;
  if (!device_) return;
  // CUDA: the collective is enqueued on rustccl's stream. Complete the
  // future now with that stream current, so that its events (and any copy
  // back into non-contiguous outputs) are ordered after the collective,
  // exactly as torch's NCCL backend does.
  uint64_t stream = 0;
  int dev = rustccl_work_device(h, &stream);
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  if (dev < 0) {
    // Staged through host memory (a reduction NCCL lacks): the results are
    // already in device memory, written synchronously.
    staging_.finish();
    future_->markCompleted(c10::IValue(outputs_));
    return;
  }
  TORCH_CHECK(dev == device_->index(), "rustccl: engine ran CUDA work on device ", dev, ", expected ", *device_);
  c10::Stream comm = externalStream(*device_, stream);
  c10::Stream prev = impl.exchangeStream(comm);
  try {
    staging_.finish();
    for (auto& [user, staged] : staging_.copy_back) {
      impl.recordDataPtrOnStream(staged.storage().data_ptr(), comm);
      impl.recordDataPtrOnStream(user.storage().data_ptr(), comm);
    }
    // Input copies: the allocator must not hand their memory out again
    // before rustccl's stream has read them (under graph capture the engine
    // keeps no reference, so this is what keeps them safe).
    for (auto& t : staging_.temps) impl.recordDataPtrOnStream(t.storage().data_ptr(), comm);
    staging_.temps.clear();
    future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    impl.exchangeStream(prev);
    throw;
  }
  impl.exchangeStream(prev);
}

void Work::onDone(void* ctx, int32_t status, const char* message, int32_t source_rank) {
  auto* holder = static_cast<c10::intrusive_ptr<Work>*>(ctx);
  c10::intrusive_ptr<Work> self = std::move(*holder);
  delete holder;
  try {
    self->source_rank_.store(source_rank);
    std::string msg = message != nullptr ? message : "rustccl: unknown error";
    if (self->device_) {
      // The future completed at submission; record a late failure for wait().
      if (status != RUSTCCL_OK) {
        std::lock_guard<std::mutex> g(self->error_mu_);
        self->device_error_ = makeException(status, msg);
      }
    } else if (status == RUSTCCL_OK) {
      self->staging_.finish();
    }
    if (self->recordFunctionEndCallback_) {
      self->recordFunctionEndCallback_();
      self->recordFunctionEndCallback_ = nullptr;
    }
    self->staging_.copy_back.clear();
    self->staging_.temps.clear();
    if (!self->device_) {
      if (status == RUSTCCL_OK) {
        self->future_->markCompleted(c10::IValue(self->outputs_));
      } else {
        self->future_->setError(makeException(status, msg));
      }
    }
  } catch (...) {
    // Never let an exception reach the engine's thread.
    try {
      self->future_->setErrorIfNeeded(std::current_exception());
    } catch (...) {
    }
  }
}

bool Work::isCompleted() {
  if (device_) return handle_ != nullptr && rustccl_work_is_completed(handle_) != 0;
  return future_->completed();
}

bool Work::isSuccess() const {
  if (device_) {
    std::lock_guard<std::mutex> g(error_mu_);
    return handle_ != nullptr && rustccl_work_is_completed(handle_) != 0 && !device_error_ &&
           rustccl_work_error(handle_) == RUSTCCL_OK;
  }
  return future_->completed() && !future_->hasError();
}

std::exception_ptr Work::exception() const {
  if (device_) {
    std::lock_guard<std::mutex> g(error_mu_);
    return device_error_;
  }
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

int Work::sourceRank() const {
  int r = source_rank_.load();
  TORCH_CHECK(r >= 0, "rustccl: sourceRank() is only known for a finished recv");
  return r;
}

std::vector<at::Tensor> Work::result() { return outputs_; }

void Work::throwIfDeviceError() {
  {
    std::lock_guard<std::mutex> g(error_mu_);
    if (device_error_) std::rethrow_exception(device_error_);
  }
  int32_t rc = rustccl_work_error(handle_);
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
}

void Work::orderCurrentStream() {
  // Without outputs to copy back, the end of the collective is rustccl's
  // `done` event: wait on it directly (as torch's NCCL backend waits on its
  // end event). With copies, the future's events come after them.
  if (staged_ || handle_ == nullptr) {
    future_->wait();
    return;
  }
  int32_t rc = rustccl_work_order_stream(handle_, currentStream(*device_));
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
}

void Work::synchronize() {
  // CUDA: the caller's current stream waits for the collective (no host
  // blocking). CPU: nothing to order.
  if (device_) orderCurrentStream();
}

bool Work::wait(std::chrono::milliseconds timeout) {
  if (device_) {
    // With a timeout, block the host until the device finished (as NCCL's
    // blocking wait does); always order the current stream after the work.
    if (timeout != kNoTimeout && handle_ != nullptr) {
      int32_t rc = rustccl_work_wait(handle_, timeout.count());
      if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
    }
    orderCurrentStream();
    throwIfDeviceError();
    return true;
  }
  if (handle_ != nullptr && timeout != kNoTimeout) {
    int32_t rc = rustccl_work_wait(handle_, timeout.count());
    if (rc == RUSTCCL_WAIT_TIMEOUT) throwStatus(rc, rustccl_last_error());
  }
  // The engine completes the future (after copying back into the caller's
  // tensors) right after it finishes: poll it briefly, then block on it.
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
  while (!future_->completed() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  future_->wait();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() { return future_; }

// ------------------------------------------------------------ CoalescedWork

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)),
      future_(c10::make_intrusive<c10::ivalue::Future>(tensorListType())) {
  auto remaining = std::make_shared<std::atomic<size_t>>(works_.size());
  auto fut = future_;
  auto all = works_;
  if (works_.empty()) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return;
  }
  for (auto& w : works_) {
    w->getFuture()->addCallback([remaining, fut, all](c10::ivalue::Future& f) {
      if (f.hasError()) {
        fut->setErrorIfNeeded(f.exception_ptr());
      }
      if (remaining->fetch_sub(1) == 1 && !fut->completed()) {
        std::vector<at::Tensor> outs;
        for (auto& x : all) {
          auto r = x->result();
          outs.insert(outs.end(), r.begin(), r.end());
        }
        try {
          fut->markCompleted(c10::IValue(outs));
        } catch (...) {
        }
      }
    });
  }
}

bool CoalescedWork::isCompleted() { return future_->completed(); }
bool CoalescedWork::isSuccess() const { return future_->completed() && !future_->hasError(); }
std::exception_ptr CoalescedWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}
std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> outs;
  for (auto& w : works_) {
    auto r = w->result();
    outs.insert(outs.end(), r.begin(), r.end());
  }
  return outs;
}
bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  for (auto& w : works_) w->wait(timeout);
  future_->wait();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}
c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() { return future_; }

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
  checkOne(tensors, "broadcast");
  Submission s(*this, "broadcast", c10d::OpType::BROADCAST, "rustccl:broadcast");
  s.add(RUSTCCL_BROADCAST, 0, opts.rootRank).inout(tensors[0]);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) {
  checkOne(tensors, "all_reduce");
  Submission s(*this, "all_reduce", c10d::OpType::ALLREDUCE, "rustccl:all_reduce");
  s.add(RUSTCCL_ALL_REDUCE, engineOp(opts.reduceOp)).inoutScaled(opts.reduceOp, tensors[0], true);
  s.sync(!opts.asyncOp);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_sparse(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) {
  TORCH_CHECK(false, "rustccl all_reduce: sparse tensors are not supported; only dense (strided) tensors are");
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "rustccl all_reduce_coalesced: no tensors given");
  Submission s(*this, "all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, "rustccl:all_reduce_coalesced");
  for (auto& t : tensors) checkPremul(opts.reduceOp, t, true, "all_reduce_coalesced");
  s.add(RUSTCCL_ALL_REDUCE, engineOp(opts.reduceOp));
  for (auto& t : tensors) s.inoutScaled(opts.reduceOp, t, true);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checkOne(tensors, "reduce");
  Submission s(*this, "reduce", c10d::OpType::REDUCE, "rustccl:reduce");
  // Only the root's tensor receives the result: elsewhere a scaled copy
  // goes in and the caller's input keeps its values.
  s.add(RUSTCCL_REDUCE, engineOp(opts.reduceOp), opts.rootRank)
      .inoutScaled(opts.reduceOp, tensors[0], getRank() == opts.rootRank);
  return finish(s, tensors, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs,
                                                  const c10d::AllgatherOptions& opts) {
  checkOne(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1, "rustccl all_gather: expected one output list, got ", outputs.size());
  Submission s(*this, "all_gather", c10d::OpType::ALLGATHER, "rustccl:all_gather");
  s.add(RUSTCCL_ALL_GATHER).in(inputs[0]).outs(outputs[0]);
  return finish(s, outputs[0], opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                        const c10d::AllgatherOptions& opts) {
  Submission s(*this, "all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, "rustccl:all_gather_into_tensor");
  s.add(RUSTCCL_ALL_GATHER).in(input).out(output);
  s.sync(!opts.asyncOp);
  return finish(s, {output}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives input i of rank r.
  TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(), "rustccl all_gather_coalesced: expected ",
              getSize(), " output lists (one per rank), got ", outputs.size());
  for (const auto& l : outputs) {
    TORCH_CHECK(l.size() == inputs.size(), "rustccl all_gather_coalesced: every output list needs ",
                inputs.size(), " tensors, one per input");
  }
  Submission s(*this, "all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, "rustccl:all_gather_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) {
    s.add(RUSTCCL_ALL_GATHER).in(inputs[i]);
    for (auto& l : outputs) s.out(l[i]);
  }
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
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  checkOne(inputs, "gather");
  Submission s(*this, "gather", c10d::OpType::GATHER, "rustccl:gather");
  s.add(RUSTCCL_GATHER, 0, opts.rootRank).in(inputs[0]);
  std::vector<at::Tensor> result;
  if (getRank() == opts.rootRank) {
    TORCH_CHECK(outputs.size() == 1, "rustccl gather: the root needs one output list, got ", outputs.size());
    s.outs(outputs[0]);
    result = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "rustccl gather: only the root (rank ", opts.rootRank, ") passes a gather list");
  }
  return finish(s, result, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ScatterOptions& opts) {
  checkOne(outputs, "scatter");
  Submission s(*this, "scatter", c10d::OpType::SCATTER, "rustccl:scatter");
  s.add(RUSTCCL_SCATTER, 0, opts.rootRank);
  if (getRank() == opts.rootRank) {
    TORCH_CHECK(inputs.size() == 1, "rustccl scatter: the root needs one scatter list, got ", inputs.size());
    s.ins(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "rustccl scatter: only the root (rank ", opts.rootRank, ") passes a scatter list");
  }
  s.out(outputs[0]);
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
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::ReduceScatterOptions& opts) {
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
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                      std::vector<int64_t>& output_splits,
                                                      std::vector<int64_t>& input_splits,
                                                      const c10d::AllToAllOptions& opts) {
  Submission s(*this, "all_to_all_single", c10d::OpType::ALLTOALL_BASE, "rustccl:all_to_all_single");
  s.add(RUSTCCL_ALL_TO_ALL).splits(input_splits, output_splits).in(input).out(output);
  return finish(s, {output}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                 const c10d::AllToAllOptions& opts) {
  Submission s(*this, "all_to_all", c10d::OpType::ALLTOALL, "rustccl:all_to_all");
  s.add(RUSTCCL_ALL_TO_ALL).ins(inputs).outs(outputs);
  return finish(s, outputs, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> Backend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  checkOne(tensors, "send");
  Submission s(*this, "send", c10d::OpType::SEND, "rustccl:send");
  s.add(RUSTCCL_SEND, 0, dst, tag).in(tensors[0]);
  return finish(s, tensors, c10d::kUnsetTimeout);
}

c10::intrusive_ptr<c10d::Work> Backend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  checkOne(tensors, "recv");
  Submission s(*this, "recv", c10d::OpType::RECV, "rustccl:recv");
  s.add(RUSTCCL_RECV, 0, src, tag).out(tensors[0]);
  return finish(s, tensors, c10d::kUnsetTimeout);
}

c10::intrusive_ptr<c10d::Work> Backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkOne(tensors, "recv");
  Submission s(*this, "recv", c10d::OpType::RECVANYSOURCE, "rustccl:recv");
  s.add(RUSTCCL_RECV, 0, -1, tag).out(tensors[0]);
  return finish(s, tensors, c10d::kUnsetTimeout);
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(const c10d::BarrierOptions& opts) {
  Submission s(*this, "barrier", c10d::OpType::BARRIER, "rustccl:barrier");
  s.add(RUSTCCL_BARRIER);
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
