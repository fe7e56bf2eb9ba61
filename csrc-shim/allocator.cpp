// torch's CPU allocator with rustccl's shared tensor arena in front
// (RUSTCCL_SHM_TENSORS=1, src/transport/shm/arena.rs): tensors from the
// arena's smallest size on come from memory the other ranks of the host
// map, so they read them with one copy in user space; the rest (and
// whatever the arena cannot hold) from the allocator torch had before.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include "rustccl.h"

namespace rustccl {
namespace {

c10::Allocator* g_fallback = nullptr;

// Frees either kind (raw_deallocate hands us both).
void deleteAny(void* p) {
  if (rustccl_arena_owns(p)) {
    rustccl_arena_free(p);
  } else if (p != nullptr) {
    g_fallback->raw_deleter()(p);
  }
}

void deleteShared(void* p) { rustccl_arena_free(p); }

struct SharedCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (void* p = rustccl_arena_alloc(n)) {
      return {p, p, &deleteShared, c10::Device(c10::DeviceType::CPU)};
    }
    return g_fallback->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return g_fallback->raw_deleter() ? &deleteAny : nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

// Installs the allocator (once); the arena's smallest tensor in bytes.
int64_t useSharedTensors() {
  static SharedCpuAllocator* installed = nullptr;
  int64_t min = rustccl_arena_enable();
  TORCH_CHECK(min >= 0, rustccl_last_error());
  if (installed == nullptr) {
    g_fallback = c10::GetCPUAllocator();
    installed = new SharedCpuAllocator();  // lives as long as the process
    c10::SetCPUAllocator(installed, /*priority=*/1);
  }
  TORCH_CHECK(c10::GetCPUAllocator() == installed,
              "rustccl: RUSTCCL_SHM_TENSORS=1 but another CPU allocator of higher priority is installed in torch");
  return min;
}

}  // namespace
}  // namespace rustccl

TORCH_LIBRARY_FRAGMENT(rustccl, m) { m.def("_use_shared_tensors() -> int", &rustccl::useSharedTensors); }
