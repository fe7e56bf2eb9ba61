// rustccl's one-shot all-reduce over NVLink peer memory.
//
// Compiled at run time with NVRTC (src/cuda/nvrtc.rs) for the device's
// compute capability; launched by src/comm/nccl/custom.rs. No headers: the
// half and bfloat16 conversions are PTX instructions.
//
// Every rank owns one region of device memory, mapped into every other
// rank's address space with CUDA IPC:
//
//   [0, 2048)      flags[block][rank]: written by peer `rank` for `block`
//   [2048, 2304)   counters[block]: calls this block has completed (local)
//   [4096, ...)    two data buffers of `cap` bytes each
//
// Block b of every rank owns the same byte range [b*piece, (b+1)*piece) of
// the tensor. A call, for block b with counter c and flag f = c + 1:
//   1. copies its range of the input into data buffer f % 2 of its region;
//   2. tells every peer (st.release.sys into the peer's flags[b][rank]) and
//      waits until every peer's flag in its own region is >= f
//      (ld.acquire.sys), so all peers' copies of the range are visible;
//   3. reads the range from every rank's buffer, in rank order 0..world-1
//      (so every rank computes bitwise the same result), and writes the
//      result into the output.
// Two buffers make an end barrier unnecessary: a rank writes buffer f % 2
// again only at flag f + 2, which needs every peer's flag f + 1, which a
// peer writes only in a later kernel, after it finished reading flag f's
// buffer. Counters live on the device, so CUDA graph replays stay in step.
// A wait gives up after `timeout_ns`, or when the host sets the abort word
// (a dead peer must not leave a kernel spinning forever), and says so in
// the error word, which the host's watchdog reads.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef long long i64;

#define MAX_RANKS 8
#define MAX_BLOCKS 64
#define FLAGS_OFF 0
#define COUNTERS_OFF 2048
#define DATA_OFF 4096

struct Args {
  u64 input;              // this rank's tensor, read first
  u64 output;             // where the result goes (may equal input)
  u64 bufs[MAX_RANKS];    // every rank's region, mapped here
  u64 nbytes;             // bytes of the tensor
  u64 piece;              // bytes per block, a multiple of 16
  u64 cap;                // bytes of each data buffer
  u64 timeout_ns;         // give up waiting for peers after this long
  u64 abort;              // host-mapped word: nonzero once the group is aborted
  u64 error;              // host-mapped word: set to 1 when a wait gives up
  u32 rank;
  u32 world;
  u32 vec;                // 1: input and output are 16-byte aligned
  u32 pad;
};

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(v), "l"(p) : "memory");
}

__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f2b(float f) {
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// Element types: T as stored, A as accumulated.
template <typename X> struct Plain { typedef X T; typedef X A;
  static __device__ __forceinline__ A load(T v) { return v; }
  static __device__ __forceinline__ T store(A a) { return a; } };
typedef Plain<float> F32;
typedef Plain<double> F64;
typedef Plain<int> I32;
typedef Plain<i64> I64;
struct F16 { typedef u16 T; typedef float A;
  static __device__ __forceinline__ A load(T v) { return h2f(v); }
  static __device__ __forceinline__ T store(A a) { return f2h(a); } };
struct BF16 { typedef u16 T; typedef float A;
  static __device__ __forceinline__ A load(T v) { return b2f(v); }
  static __device__ __forceinline__ T store(A a) { return f2b(a); } };

// Integer sums and products wrap (two's complement), as on the CPU path.
__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ double add(double a, double b) { return a + b; }
__device__ __forceinline__ int add(int a, int b) { return (int)((u32)a + (u32)b); }
__device__ __forceinline__ i64 add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ float mul(float a, float b) { return a * b; }
__device__ __forceinline__ double mul(double a, double b) { return a * b; }
__device__ __forceinline__ int mul(int a, int b) { return (int)((u32)a * (u32)b); }
__device__ __forceinline__ i64 mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }

// MIN / MAX propagate NaN, like torch.minimum / torch.maximum.
template <typename A> __device__ __forceinline__ A mn(A a, A b) { return (a != a) ? a : ((b != b) ? b : (b < a ? b : a)); }
template <typename A> __device__ __forceinline__ A mx(A a, A b) { return (a != a) ? a : ((b != b) ? b : (b > a ? b : a)); }

// OP: 0 sum, 1 avg, 2 product, 3 min, 4 max (rustccl's ReduceOp numbering).
template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) {
  if (OP == 2) return mul(a, b);
  if (OP == 3) return mn(a, b);
  if (OP == 4) return mx(a, b);
  return add(a, b);
}
template <int OP, typename A> __device__ __forceinline__ A finish(A a, u32 world) {
  if (OP == 1) return a / (A)world;  // integers: truncating, as NCCL
  return a;
}

template <typename E> union Pack {
  uint4 v;
  typename E::T e[16 / sizeof(typename E::T)];
};

template <typename E, int OP>
__device__ __forceinline__ void reduce_pack(const Args& a, u64 data_off, u64 off) {
  typedef typename E::A A;
  const int N = 16 / sizeof(typename E::T);
  Pack<E> in[MAX_RANKS];
#pragma unroll
  for (int r = 0; r < MAX_RANKS; r++)
    if (r < (int)a.world) in[r].v = *(const uint4*)(a.bufs[r] + data_off + off);
  A acc[N];
#pragma unroll
  for (int i = 0; i < N; i++) acc[i] = E::load(in[0].e[i]);
#pragma unroll
  for (int r = 1; r < MAX_RANKS; r++)
    if (r < (int)a.world) {
#pragma unroll
      for (int i = 0; i < N; i++) acc[i] = combine<OP>(acc[i], E::load(in[r].e[i]));
    }
  Pack<E> out;
#pragma unroll
  for (int i = 0; i < N; i++) out.e[i] = E::store(finish<OP>(acc[i], a.world));
  *(uint4*)(a.output + off) = out.v;
}

template <typename E, int OP>
__device__ __forceinline__ void reduce_one(const Args& a, u64 data_off, u64 off) {
  typedef typename E::T T;
  typedef typename E::A A;
  A acc = E::load(*(const T*)(a.bufs[0] + data_off + off));
  for (u32 r = 1; r < a.world; r++) acc = combine<OP>(acc, E::load(*(const T*)(a.bufs[r] + data_off + off)));
  *(T*)(a.output + off) = E::store(finish<OP>(acc, a.world));
}

template <typename E, int OP>
__device__ void allreduce(const Args& a) {
  typedef typename E::T T;
  __shared__ u32 s_flag;
  __shared__ int s_fail;
  const u32 b = blockIdx.x;
  const u64 mine = a.bufs[a.rank];
  u32* counter = (u32*)(mine + COUNTERS_OFF) + b;
  if (threadIdx.x == 0) {
    s_flag = *counter + 1;
    s_fail = 0;
  }
  __syncthreads();
  const u32 flag = s_flag;
  const u64 data_off = DATA_OFF + (u64)(flag & 1) * a.cap;
  const u64 lo = (u64)b * a.piece;
  const u64 hi = min(lo + a.piece, a.nbytes);
  const u64 vend = a.vec ? lo + ((hi - lo) / 16) * 16 : lo;
  const u64 step = (u64)blockDim.x * 16;

  // 1. this block's range of the input into this rank's buffer
  for (u64 off = lo + threadIdx.x * 16; off < vend; off += step)
    *(uint4*)(mine + data_off + off) = *(const uint4*)(a.input + off);
  for (u64 off = vend + threadIdx.x * sizeof(T); off < hi; off += (u64)blockDim.x * sizeof(T))
    *(T*)(mine + data_off + off) = *(const T*)(a.input + off);

  // 2. flags: tell every peer, wait for every peer
  __syncthreads();
  if (threadIdx.x < a.world) {
    st_release((u32*)(a.bufs[threadIdx.x] + FLAGS_OFF) + b * MAX_RANKS + a.rank, flag);
    const u32* from = (const u32*)(mine + FLAGS_OFF) + b * MAX_RANKS + threadIdx.x;
    u64 t0 = 0;
    u32 spins = 0;
    while ((int)(ld_acquire(from) - flag) < 0) {
      if ((++spins & 1023) == 0) {
        u64 t = globaltimer();
        if (t0 == 0) {
          t0 = t;
        } else if (t - t0 > a.timeout_ns || *(volatile const u32*)a.abort != 0) {
          s_fail = 1;
          *(volatile u32*)a.error = 1u;
          break;
        }
      }
    }
  }
  __syncthreads();
  if (s_fail) return;

  // 3. reduce every rank's copy, in rank order
  for (u64 off = lo + threadIdx.x * 16; off < vend; off += step) reduce_pack<E, OP>(a, data_off, off);
  for (u64 off = vend + threadIdx.x * sizeof(T); off < hi; off += (u64)blockDim.x * sizeof(T))
    reduce_one<E, OP>(a, data_off, off);
  if (threadIdx.x == 0) *counter = flag;
}

#define RUSTCCL_AR(NAME, E)                                                                          \
  extern "C" __global__ void __launch_bounds__(512) rustccl_ar_##NAME##_sum(const __grid_constant__ Args a) { allreduce<E, 0>(a); }  \
  extern "C" __global__ void __launch_bounds__(512) rustccl_ar_##NAME##_avg(const __grid_constant__ Args a) { allreduce<E, 1>(a); }  \
  extern "C" __global__ void __launch_bounds__(512) rustccl_ar_##NAME##_prod(const __grid_constant__ Args a) { allreduce<E, 2>(a); } \
  extern "C" __global__ void __launch_bounds__(512) rustccl_ar_##NAME##_min(const __grid_constant__ Args a) { allreduce<E, 3>(a); }  \
  extern "C" __global__ void __launch_bounds__(512) rustccl_ar_##NAME##_max(const __grid_constant__ Args a) { allreduce<E, 4>(a); }

RUSTCCL_AR(f32, F32)
RUSTCCL_AR(f64, F64)
RUSTCCL_AR(f16, F16)
RUSTCCL_AR(bf16, BF16)
RUSTCCL_AR(i32, I32)
RUSTCCL_AR(i64, I64)
