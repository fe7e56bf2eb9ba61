// New groups from an existing one (torch's split_group and shrink_group),
// gloo's monitored barrier, and eager CUDA connection for groups bound to a
// device. The engine does the work (src/comm/regroup.rs, monitor.rs); this
// file wraps its communicators in Backends.
#include "backend.hpp"
#include "util.hpp"

namespace rustccl {
namespace {

// A Backend around a communicator the engine just made.
c10::intrusive_ptr<c10d::Backend> wrap(const RustcclComm* comm, std::chrono::milliseconds timeout) {
  int rank = rustccl_comm_rank(comm);
  int size = rustccl_comm_size(comm);
  return c10::make_intrusive<Backend>(comm, rank, size, timeout);
}

}  // namespace

c10::intrusive_ptr<c10d::Backend::Options> Backend::getBackendOptions() {
  return c10::make_intrusive<Options>("rustccl", timeout_);
}

void Backend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  int32_t rc = rustccl_comm_monitored_barrier(comm_, effective(opts.timeout).count(), waitAllRanks ? 1 : 0);
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
}

void Backend::eagerConnectSingleDevice(at::Device device) {
  // init_process_group(device_id=cuda:i): create the NCCL communicator now,
  // as torch's nccl backend does, instead of on the first CUDA collective.
  if (!device.is_cuda()) return;
  int32_t rc = rustccl_comm_connect_cuda(comm_, device.has_index() ? device.index() : 0);
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
}

c10::intrusive_ptr<c10d::Backend> Backend::split(const c10::intrusive_ptr<c10d::Store>& /*store*/,
                                                 const std::vector<int>& ranks,
                                                 const c10::intrusive_ptr<Options>& opts) {
  // Every rank of this group calls split (torch guarantees it, as NCCL's
  // ncclCommSplit needs); the engine agrees over this group's links, so
  // the store torch passes is not needed.
  std::string name = opts ? opts->group_name : std::string();
  {
    std::lock_guard<std::mutex> g(splits_mu_);
    auto it = splits_.find(name);
    if (it != splits_.end()) {
      auto made = it->second.lock();
      splits_.erase(it);
      return made;  // empty for a rank outside the new group
    }
  }
  std::vector<int64_t> members(ranks.begin(), ranks.end());
  auto timeout = opts ? opts->timeout : timeout_;
  const RustcclComm* child = nullptr;
  int32_t rc = rustccl_comm_split(comm_, members.data(), members.size(), name.c_str(), timeout.count(), &child);
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
  c10::intrusive_ptr<c10d::Backend> made;
  if (child != nullptr) made = wrap(child, timeout);
  std::lock_guard<std::mutex> g(splits_mu_);
  splits_.insert_or_assign(name, c10::weak_intrusive_ptr<c10d::Backend>(made));
  return made;
}

c10::intrusive_ptr<c10d::Backend> Backend::shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                                  const c10::intrusive_ptr<Options>& opts_override) {
  // torch's SHRINK_ABORT is 0x01: abort what this group still has in flight.
  constexpr int kShrinkAbort = 0x01;
  auto timeout = opts_override ? opts_override->timeout : timeout_;
  const RustcclComm* child = nullptr;
  int32_t rc = rustccl_comm_shrink(comm_, ranks_to_exclude.data(), ranks_to_exclude.size(),
                                   (shrink_flags & kShrinkAbort) ? 1 : 0, timeout.count(), &child);
  if (rc != RUSTCCL_OK) throwStatus(rc, rustccl_last_error());
  return wrap(child, timeout);
}

}  // namespace rustccl
