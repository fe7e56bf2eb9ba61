// Sparse (COO) all-reduce, as gloo does it: every rank's indices and values
// are all-gathered (padded to the largest count) through the dense
// collectives, and the result is the coalesced sum: the same values as a
// dense all-reduce of the densified tensors. SUM only, like gloo.
#include <ATen/ATen.h>

#include "backend.hpp"
#include "util.hpp"

namespace rustccl {
namespace {

// A work that finished before it was returned (the sparse all-reduce runs
// its dense steps on the calling thread).
class FinishedWork : public c10d::Work {
 public:
  FinishedWork(int rank, std::vector<at::Tensor> result, std::optional<c10::Device> device)
      : c10d::Work(rank, c10d::OpType::ALLREDUCE, "rustccl:all_reduce_sparse"),
        result_(std::move(result)),
        future_(device ? c10::make_intrusive<c10::ivalue::Future>(tensorListType(), std::vector<c10::Device>{*device})
                       : c10::make_intrusive<c10::ivalue::Future>(tensorListType())) {
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> Backend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  checkOne(tensors, "all_reduce");
  at::Tensor& t = tensors[0];
  TORCH_CHECK(t.layout() == c10::kSparse, "rustccl all_reduce: ", t.layout(),
              " tensors are not supported; only dense (strided) and sparse COO tensors are");
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
              "rustccl all_reduce: sparse tensors support only ReduceOp.SUM (as gloo does)");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "rustccl all_reduce: sparse tensors on device ", t.device(),
              " are not supported (cpu and cuda only)");
  {
    std::lock_guard<std::mutex> g(coalescing_mu_);
    TORCH_CHECK(!coalescing_, "rustccl all_reduce: a sparse tensor cannot join a coalesced batch");
  }
  at::NoGradGuard no_grad;
  at::Tensor in = t.coalesce();
  at::Tensor idx = in._indices().contiguous();  // [sparse_dim, nnz]
  at::Tensor val = in._values().contiguous();   // [nnz, dense dims...]
  const int64_t nnz = in._nnz();
  const int64_t n = getSize();
  c10d::AllgatherOptions ag;
  ag.timeout = opts.timeout;

  // 1. Every rank's count of entries.
  at::Tensor mine = at::full({1}, nnz, idx.options());
  at::Tensor counts = at::empty({n}, idx.options());
  _allgather_base(counts, mine, ag)->wait();
  std::vector<int64_t> count(n);
  at::Tensor counts_host = counts.cpu();
  for (int64_t r = 0; r < n; ++r) count[r] = counts_host[r].item<int64_t>();
  const int64_t most = *std::max_element(count.begin(), count.end());

  // 2. Indices and values, padded to the largest count.
  at::Tensor idx_pad = at::zeros({idx.size(0), most}, idx.options());
  idx_pad.narrow(1, 0, nnz).copy_(idx);
  std::vector<int64_t> vshape = val.sizes().vec();
  vshape[0] = most;
  at::Tensor val_pad = at::zeros(vshape, val.options());
  val_pad.narrow(0, 0, nnz).copy_(val);
  std::vector<int64_t> all_vshape = vshape;
  all_vshape.insert(all_vshape.begin(), n);
  at::Tensor all_idx = at::empty({n, idx.size(0), most}, idx.options());
  at::Tensor all_val = at::empty(all_vshape, val.options());
  _allgather_base(all_idx, idx_pad, ag)->wait();
  _allgather_base(all_val, val_pad, ag)->wait();

  // 3. Every rank's entries, summed by coalescing.
  std::vector<at::Tensor> is, vs;
  for (int64_t r = 0; r < n; ++r) {
    is.push_back(all_idx[r].narrow(1, 0, count[r]));
    vs.push_back(all_val[r].narrow(0, 0, count[r]));
  }
  at::Tensor sum = at::sparse_coo_tensor(at::cat(is, 1), at::cat(vs, 0), t.sizes(), in.options()).coalesce();
  t.copy_(sum);
  std::optional<c10::Device> cuda;
  if (t.is_cuda()) cuda = t.device();
  return c10::make_intrusive<FinishedWork>(getRank(), std::vector<at::Tensor>{sum}, cuda);
}

}  // namespace rustccl
