// Work and CoalescedWork (see backend.hpp): how the engine's completions
// become c10 futures, waits and stream orderings.
#include "backend.hpp"
#include "util.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <thread>

namespace rustccl {

void Staging::finish() {
  for (auto& [user, staged] : copy_back) user.copy_(staged);
}

void Staging::absorb(Staging& o) {
  for (auto& p : o.copy_back) copy_back.push_back(std::move(p));
  for (auto& t : o.temps) temps.push_back(std::move(t));
  o.copy_back.clear();
  o.temps.clear();
}

// ------------------------------------------------------------------ Work

Work::Work(int rank, c10d::OpType type, const char* title, const std::optional<std::vector<at::Tensor>>& profiled,
           std::optional<c10::Device> device)
    : c10d::Work(rank, type, title, profiled),
      device_(device),
      future_(device ? nullptr : c10::make_intrusive<c10::ivalue::Future>(tensorListType())) {}

Work::~Work() {
  if (handle_ != nullptr) rustccl_work_release(handle_);
}

void Work::adopt(std::vector<at::Tensor> outputs, Staging staging) {
  if (outputs_.empty()) {
    outputs_ = std::move(outputs);
  } else {
    outputs_.insert(outputs_.end(), outputs.begin(), outputs.end());
  }
  staged_ = staged_ || !staging.copy_back.empty();
  staging_.absorb(staging);
}

void Work::completeOnDevice(const c10::intrusive_ptr<c10::ivalue::Future>& f) {
  if (ran_on_device_ < 0) {
    f->markCompleted(c10::IValue(outputs_));
    return;
  }
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  c10::Stream prev = impl.exchangeStream(externalStream(*device_, ran_on_));
  try {
    f->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    impl.exchangeStream(prev);
    throw;
  }
  impl.exchangeStream(prev);
}

void Work::submitted(::RustcclWork* h) {
  handle_ = h;
  if (!device_) return;
  // CUDA: the collective is enqueued (on rustccl's stream, or the caller's
  // for a synchronous peer-memory call). A future, when one is asked for,
  // completes with that stream current, so that its events (and any copy
  // back into non-contiguous outputs) are ordered after the collective,
  // exactly as torch's NCCL backend does.
  uint64_t stream = 0;
  int dev = rustccl_work_device(h, &stream);
  if (dev >= 0) {
    TORCH_CHECK(dev == device_->index(), "rustccl: engine ran CUDA work on device ", dev, ", expected ", *device_);
  }
  c10::intrusive_ptr<c10::ivalue::Future> complete;
  {
    std::lock_guard<std::mutex> g(future_mu_);
    ran_on_device_ = dev;
    ran_on_ = stream;
    submitted_ = true;
    // Copies back: wait() goes through the future's events, which must
    // follow the copies; make it now. A future asked for before submission
    // (a coalescing batch's work) completes now too.
    if (!future_ && (staged_ || dev < 0)) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(tensorListType(), std::vector<c10::Device>{*device_});
    }
    complete = future_;
  }
  if (dev < 0) {
    // Staged through host memory (a reduction NCCL lacks): the results are
    // already in device memory, written synchronously.
    staging_.finish();
    complete->markCompleted(c10::IValue(outputs_));
    return;
  }
  if (staging_.copy_back.empty() && staging_.temps.empty()) {
    if (complete) completeOnDevice(complete);
    return;
  }
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
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
    if (complete) complete->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    impl.exchangeStream(prev);
    throw;
  }
  impl.exchangeStream(prev);
}

void Work::onDone(void* ctx, int32_t status, const char* message, int32_t source_rank) {
  // The reference Submission::submit released to the engine.
  c10::intrusive_ptr<Work> self = c10::intrusive_ptr<Work>::reclaim(static_cast<Work*>(ctx));
  try {
    self->source_rank_.store(source_rank);
    std::string msg = message != nullptr ? message : "rustccl: unknown error";
    if (self->device_) {
      // Its future (if one was asked for) completed at submission or on
      // demand; record a late failure for wait().
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
    // CUDA work keeps its staging until the Work goes: submitted() may
    // still be copying back on the submitting thread when a fast collective
    // is already reaped here.
    if (!self->device_) {
      self->staging_.copy_back.clear();
      self->staging_.temps.clear();
      if (status == RUSTCCL_OK) {
        self->future_->markCompleted(c10::IValue(self->outputs_));
      } else {
        self->future_->setError(makeException(status, msg));
      }
    }
  } catch (...) {
    // Never let an exception reach the engine's thread.
    try {
      c10::intrusive_ptr<c10::ivalue::Future> f;
      {
        std::lock_guard<std::mutex> g(self->future_mu_);
        f = self->future_;
      }
      if (f) f->setErrorIfNeeded(std::current_exception());
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
    getFuture()->wait();
    return;
  }
  uint64_t current = currentStream(*device_);
  if (current == ran_on_) return;  // ran on that stream: already in order
  int32_t rc = rustccl_work_order_stream(handle_, current);
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
}

void Work::synchronize() {
  // CUDA: the caller's current stream waits for the collective (no host
  // blocking). CPU: nothing to order.
  if (device_) orderCurrentStream();
}

bool Work::wait(std::chrono::milliseconds timeout) {
  ProfileSpan span(RUSTCCL_SPAN_SHIM_WAIT);
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
  // Point-to-point works: this thread reads the rings itself for a while
  // (a message arriving meanwhile needs no hand-off from rustccl's thread);
  // a CPU collective still queued: this thread runs it (comm::host).
  if (handle_ != nullptr) rustccl_work_drive(handle_);
  // The engine completes the future (after copying back into the caller's
  // tensors) right after it finishes: poll it briefly, then block on it.
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
  while (!future_->completed() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  future_->wait();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() {
  if (!device_) return future_;
  c10::intrusive_ptr<c10::ivalue::Future> f;
  bool complete = false;
  {
    std::lock_guard<std::mutex> g(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(tensorListType(), std::vector<c10::Device>{*device_});
      // Submitted already: complete it now, on the stream the work ran on
      // (its events then also follow whatever that stream got since, which
      // only orders more). Not yet: submitted() completes it.
      complete = submitted_;
    }
    f = future_;
  }
  if (complete) completeOnDevice(f);
  return f;
}

// ------------------------------------------------------------ CoalescedWork

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED),
      works_(std::move(works)),
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

}  // namespace rustccl
