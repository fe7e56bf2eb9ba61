// The C ABI between the c10d shim and the Rust engine (src/capi/mod.rs).
// Numeric values of kinds, reduce ops and status codes are shared with
// src/types.rs and src/error.rs.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct DLManagedTensor;
typedef struct RustcclComm RustcclComm;
typedef struct RustcclWork RustcclWork;

enum RustcclKind {
  RUSTCCL_ALL_REDUCE = 0,
  RUSTCCL_BROADCAST = 1,
  RUSTCCL_REDUCE = 2,
  RUSTCCL_ALL_GATHER = 3,
  RUSTCCL_REDUCE_SCATTER = 4,
  RUSTCCL_ALL_TO_ALL = 5,
  RUSTCCL_GATHER = 6,
  RUSTCCL_SCATTER = 7,
  RUSTCCL_SEND = 8,
  RUSTCCL_RECV = 9,
  RUSTCCL_BARRIER = 10,
};

enum RustcclStatus {
  RUSTCCL_OK = 0,
  RUSTCCL_INVALID_ARGUMENT = 1,
  RUSTCCL_UNSUPPORTED = 2,
  RUSTCCL_TIMEOUT = 3,
  RUSTCCL_NETWORK = 4,
  RUSTCCL_BACKEND = 5,
  RUSTCCL_WAIT_TIMEOUT = 6,
  RUSTCCL_INTERNAL = 7,
};

typedef struct {
  int32_t kind;       // RustcclKind
  int32_t reduce_op;  // c10d::ReduceOp::RedOpType
  int64_t root;       // root rank, or peer of send / recv (-1: any source)
  int64_t tag;
  DLManagedTensor* const* inputs;
  size_t n_inputs;
  DLManagedTensor* const* outputs;
  size_t n_outputs;
  const int64_t* in_splits;  // all_to_all split sizes (rows of dim 0)
  size_t n_in_splits;
  const int64_t* out_splits;
  size_t n_out_splits;
  uint64_t stream;  // CUDA: the caller's current stream on the tensors' device
  uint32_t flags;   // RUSTCCL_OP_* bits
} RustcclOpDesc;

// The caller waits for the operation right away (torch's asyncOp=false):
// rustccl may run it on the caller's stream instead of its own.
#define RUSTCCL_OP_SYNC 1u

typedef void (*RustcclDoneFn)(void* ctx, int32_t status, const char* message, int32_t source_rank);

// Message of the last failed call on this thread; never NULL.
const char* rustccl_last_error(void);

void rustccl_comm_release(const RustcclComm* comm);
// Creates the group's NCCL communicator on `device` now (every rank calls it).
int32_t rustccl_comm_connect_cuda(const RustcclComm* comm, int32_t device);
void rustccl_comm_shutdown(const RustcclComm* comm, int32_t abort);
uint64_t rustccl_comm_seq(const RustcclComm* comm);
int32_t rustccl_comm_rank(const RustcclComm* comm);
// torch's name for the group: rustccl.stats() & co. find it by that name.
void rustccl_comm_set_name(const RustcclComm* comm, const char* name);
int32_t rustccl_comm_size(const RustcclComm* comm);

// gloo's monitored barrier (blocking): rank 0 names the ranks that did not
// arrive within timeout_ms; the other ranks learn the outcome.
int32_t rustccl_comm_monitored_barrier(const RustcclComm* comm, int64_t timeout_ms, int32_t wait_all);
// torch's split: every rank of the group calls it with the sorted group
// ranks of its new group; *out is the new communicator, or NULL when this
// rank is not one of `ranks`.
int32_t rustccl_comm_split(const RustcclComm* comm, const int64_t* ranks, size_t n, const char* group,
                           int64_t timeout_ms, const RustcclComm** out);
// torch's shrink: only the survivors call it, with the sorted ranks to
// leave out; `abort` aborts the group's work in flight first.
int32_t rustccl_comm_shrink(const RustcclComm* comm, const int64_t* excluded, size_t n, int32_t abort,
                            int64_t timeout_ms, const RustcclComm** out);

// Takes ownership of every tensor in `ops`, also on failure. On success
// sets *out_work and calls done(ctx, ...) exactly once, possibly on another
// thread and possibly before returning. On failure returns a status, sets
// the last error and never calls `done`.
int32_t rustccl_submit(const RustcclComm* comm, const RustcclOpDesc* ops, size_t n_ops, int64_t timeout_ms,
                       RustcclDoneFn done, void* ctx, RustcclWork** out_work);

// timeout_ms < 0: no bound.
int32_t rustccl_work_wait(const RustcclWork* work, int64_t timeout_ms);
int32_t rustccl_work_is_completed(const RustcclWork* work);
// Moves the work's engine on from the calling thread for a few tens of
// microseconds (point-to-point works: the caller reads the rings itself),
// or runs the work there if it is a CPU collective still queued (then for
// as long as it takes); 1 once the work finished, else 0.
int32_t rustccl_work_drive(const RustcclWork* work);
int32_t rustccl_work_source_rank(const RustcclWork* work);
// CUDA work: its device (and the stream it runs on in *stream); -1 for host work.
int32_t rustccl_work_device(const RustcclWork* work, uint64_t* stream);
// Makes `stream` wait for a CUDA work (no host blocking).
int32_t rustccl_work_order_stream(const RustcclWork* work, uint64_t stream);
// 0 while pending or after success; else the error status (see rustccl_last_error).
int32_t rustccl_work_error(const RustcclWork* work);
void rustccl_work_release(RustcclWork* work);

// Host-path profile (RUSTCCL_HOST_PROFILE=1): the shim adds its own spans.
enum RustcclSpan {
  RUSTCCL_SPAN_SHIM = 4,       // a collective entry point, C ABI call included
  RUSTCCL_SPAN_SHIM_WAIT = 5,  // Work::wait
  RUSTCCL_SPAN_SHIM_P2P = 11,  // a send / recv entry point, C ABI call included
};
int32_t rustccl_host_profile_enabled(void);

// The shared tensor arena (RUSTCCL_SHM_TENSORS=1, csrc-shim/allocator.cpp).
// enable: creates it; its smallest allocation, or -1 (rustccl_last_error).
int64_t rustccl_arena_enable(void);
// NULL: not from the arena (too small, full, not enabled, forked child).
void* rustccl_arena_alloc(size_t n);
int32_t rustccl_arena_owns(const void* p);
void rustccl_arena_free(void* p);
void rustccl_host_profile_add(int32_t span, uint64_t nanos);

#ifdef __cplusplus
}
#endif
