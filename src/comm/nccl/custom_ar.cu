// rustccl's collectives over NVLink peer memory: the one-shot and two-shot
// all-reduce, all_gather_into_tensor and reduce_scatter_tensor.
//
// Compiled at run time with NVRTC (src/cuda/nvrtc.rs) for the device's
// compute capability; launched by src/comm/nccl/custom.rs. No headers: the
// half and bfloat16 conversions are PTX instructions.
//
// Every rank owns one region of device memory, mapped into every other
// rank's address space with CUDA IPC:
//
//   [0, 4096)      flags[block][rank]: written by peer `rank` for `block`
//   [4096, 4608)   counters[block]: calls completed (the epoch; local)
//   [8192, ...)    two data buffers of `cap` bytes each
//
// Vocabulary: a call has an epoch e (calls completed + 1) and uses data
// buffer e % 2 of every region. Block b of every rank owns the same byte
// ranges ("pieces") on every rank, so block b only ever waits for block b
// of its peers. A barrier at value v: block b writes v into every peer's
// flags[b][rank] (st.release.sys) and waits until flags[b][p] >= v for
// every peer p (ld.acquire.sys). Barrier values of call e are 2e - 1 and 2e
// (the one-phase kernels use only 2e), so flags only grow.
//
//   one-shot AR    stage my input in my buffer; barrier 2e; reduce every
//                  rank's copy of my pieces in rank order 0..world-1 into
//                  the output. Reads (world-1) x size over NVLink.
//   two-shot AR    the tensor is cut into world slices of `slice` bytes;
//                  stage my input; barrier 2e-1; reduce slice `rank` of
//                  every rank's copy in rank order and write the result
//                  into every rank's buffer (push); barrier 2e; copy my
//                  buffer to the output. Reads and writes (world-1)/world x
//                  size over NVLink each way. Every element is reduced by
//                  one rank only, so every rank gets bitwise the same bytes
//                  (and the same as the one-shot: same order).
//   all-gather     stage my input; barrier 2e; copy every rank's buffer
//                  into the output, rank r's at r x size (pull).
//   reduce-scatter stage my input (world pieces); barrier 2e; reduce piece
//                  `rank` of every rank's copy in rank order (pull).
//
// Two buffers make an end barrier unnecessary: a rank writes buffer e % 2
// (its own or, two-shot, a peer's) again only in call e + 2, and finishing
// call e + 1 took every peer's barrier of call e + 1, which a peer reaches
// only after its call e kernel ended (stream order). The epoch is the same
// for every block of a call (block 0 also advances the counters of blocks
// the call did not use), so calls of different sizes, and different kinds,
// can follow each other. Counters live on the device, so CUDA graph replays
// stay in step. A wait gives up after `timeout_ns`, or when the host sets
// the abort word (a dead peer must not leave a kernel spinning forever),
// and says so in the error word, which the host's watchdog reads.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;

#define MAX_RANKS 8
#define MAX_BLOCKS 128
#define FLAGS_OFF 0
#define COUNTERS_OFF 4096
#define DATA_OFF 8192

struct Args {
  u64 input;              // this rank's tensor, read first
  u64 output;             // where the result goes (may equal input)
  u64 bufs[MAX_RANKS];    // every rank's region, mapped here
  u64 nbytes;             // bytes per rank: AR the tensor, AG the input, RS the output
  u64 piece;              // bytes per block (per slice, two-shot), a multiple of 16
  u64 cap;                // bytes of each data buffer
  u64 timeout_ns;         // give up waiting for peers after this long
  u64 abort;              // host-mapped word: nonzero once the group is aborted
  u64 error;              // host-mapped word: set to 1 when a wait gives up
  u64 slice;              // two-shot: bytes per rank's slice, a multiple of 16
  u32 rank;
  u32 world;
  u32 vec;                // AR / RS: 1 when input and output allow 16-byte accesses
                          // AG: widest access (16, 8, 4, 2, 1) input, output and nbytes allow
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

// 16 bytes at offset `off` of data buffer `data_off`, reduced over every
// rank's region in rank order.
template <typename E, int OP>
__device__ __forceinline__ uint4 reduce16(const Args& a, u64 data_off, u64 off) {
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
  return out.v;
}

// One element at offset `off`, as reduce16.
template <typename E, int OP>
__device__ __forceinline__ typename E::T reduce1(const Args& a, u64 data_off, u64 off) {
  typedef typename E::T T;
  typedef typename E::A A;
  A acc = E::load(*(const T*)(a.bufs[0] + data_off + off));
  for (u32 r = 1; r < a.world; r++) acc = combine<OP>(acc, E::load(*(const T*)(a.bufs[r] + data_off + off)));
  return E::store(finish<OP>(acc, a.world));
}

// Copies `len` bytes (a multiple of w) with accesses of w bytes, the block's
// threads striding.
__device__ __forceinline__ void copy_w(u64 dst, u64 src, u64 len, u32 w) {
  const u64 step = (u64)blockDim.x * w;
  const u64 first = (u64)threadIdx.x * w;
  switch (w) {
    case 16: for (u64 i = first; i < len; i += step) *(uint4*)(dst + i) = *(const uint4*)(src + i); break;
    case 8: for (u64 i = first; i < len; i += step) *(u64*)(dst + i) = *(const u64*)(src + i); break;
    case 4: for (u64 i = first; i < len; i += step) *(u32*)(dst + i) = *(const u32*)(src + i); break;
    case 2: for (u64 i = first; i < len; i += step) *(u16*)(dst + i) = *(const u16*)(src + i); break;
    default: for (u64 i = first; i < len; i += step) *(u8*)(dst + i) = *(const u8*)(src + i); break;
  }
}

// `len` bytes: whole 16-byte packs when `vec`, the rest by elements of `t` bytes.
__device__ __forceinline__ void copy_range(u64 dst, u64 src, u64 len, bool vec, u32 t) {
  const u64 v = vec ? (len / 16) * 16 : 0;
  copy_w(dst, src, v, 16);
  if (v < len) copy_w(dst + v, src + v, len - v, t);
}

// Block b's piece of [base, base + len): [lo, hi), clipped to `limit`.
__device__ __forceinline__ void piece_of(u64 base, u64 len, u64 piece, u64 limit, u64* lo, u64* hi) {
  const u64 l = base + (u64)blockIdx.x * piece;
  const u64 h = base + min(len, (u64)(blockIdx.x + 1) * piece);
  *lo = min(l, limit);
  *hi = max(min(h, limit), *lo);
}

// The call's epoch (same for every block, see above).
__device__ __forceinline__ u32 epoch_begin(const Args& a) {
  __shared__ u32 s_epoch;
  if (threadIdx.x == 0) s_epoch = *((const u32*)(a.bufs[a.rank] + COUNTERS_OFF) + blockIdx.x) + 1;
  __syncthreads();
  return s_epoch;
}

__device__ __forceinline__ void epoch_end(const Args& a, u32 epoch) {
  if (threadIdx.x != 0) return;
  u32* counters = (u32*)(a.bufs[a.rank] + COUNTERS_OFF);
  counters[blockIdx.x] = epoch;
  if (blockIdx.x == 0)
    for (u32 k = gridDim.x; k < MAX_BLOCKS; k++) counters[k] = epoch;
}

// Block b's barrier at `value` with block b of every peer (see above);
// false when it gave up (timeout or abort). Every thread calls it.
__device__ __forceinline__ bool barrier(const Args& a, u32 value) {
  __shared__ int s_fail;
  const u32 b = blockIdx.x;
  if (threadIdx.x == 0) s_fail = 0;
  __syncthreads();
  if (threadIdx.x < a.world) {
    st_release((u32*)(a.bufs[threadIdx.x] + FLAGS_OFF) + b * MAX_RANKS + a.rank, value);
    const u32* from = (const u32*)(a.bufs[a.rank] + FLAGS_OFF) + b * MAX_RANKS + threadIdx.x;
    u64 t0 = 0;
    u32 spins = 0;
    while ((int)(ld_acquire(from) - value) < 0) {
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
  return s_fail == 0;
}

template <typename E, int OP>
__device__ void one_shot(const Args& a) {
  typedef typename E::T T;
  const u32 e = epoch_begin(a);
  const u64 data_off = DATA_OFF + (u64)(e & 1) * a.cap;
  const u64 mine = a.bufs[a.rank] + data_off;
  u64 lo, hi;
  piece_of(0, a.nbytes, a.piece, a.nbytes, &lo, &hi);
  copy_range(mine + lo, a.input + lo, hi - lo, a.vec != 0, sizeof(T));
  if (!barrier(a, 2 * e)) return;
  const u64 vend = a.vec ? lo + ((hi - lo) / 16) * 16 : lo;
  const u64 step = (u64)blockDim.x * 16;
  for (u64 off = lo + threadIdx.x * 16; off < vend; off += step) *(uint4*)(a.output + off) = reduce16<E, OP>(a, data_off, off);
  for (u64 off = vend + threadIdx.x * sizeof(T); off < hi; off += (u64)blockDim.x * sizeof(T))
    *(T*)(a.output + off) = reduce1<E, OP>(a, data_off, off);
  epoch_end(a, e);
}

template <typename E, int OP>
__device__ void two_shot(const Args& a) {
  typedef typename E::T T;
  const u32 e = epoch_begin(a);
  const u64 data_off = DATA_OFF + (u64)(e & 1) * a.cap;
  const u64 mine = a.bufs[a.rank] + data_off;
  u64 lo, hi;
  // 1. my piece of every slice into my buffer
  for (u32 s = 0; s < a.world; s++) {
    piece_of((u64)s * a.slice, a.slice, a.piece, a.nbytes, &lo, &hi);
    copy_range(mine + lo, a.input + lo, hi - lo, a.vec != 0, sizeof(T));
  }
  if (!barrier(a, 2 * e - 1)) return;
  // 2. my piece of my slice, reduced in rank order, into every rank's buffer
  piece_of((u64)a.rank * a.slice, a.slice, a.piece, a.nbytes, &lo, &hi);
  const u64 vend = lo + ((hi - lo) / 16) * 16;  // buffers are always 16-byte aligned
  const u64 step = (u64)blockDim.x * 16;
  for (u64 off = lo + threadIdx.x * 16; off < vend; off += step) {
    const uint4 v = reduce16<E, OP>(a, data_off, off);
#pragma unroll
    for (int r = 0; r < MAX_RANKS; r++)
      if (r < (int)a.world) *(uint4*)(a.bufs[r] + data_off + off) = v;
  }
  for (u64 off = vend + threadIdx.x * sizeof(T); off < hi; off += (u64)blockDim.x * sizeof(T)) {
    const T v = reduce1<E, OP>(a, data_off, off);
    for (u32 r = 0; r < a.world; r++) *(T*)(a.bufs[r] + data_off + off) = v;
  }
  // The stores above went to peers' memory: make them visible at system
  // scope before the barrier's release (the one-phase kernels only store
  // into their own region before a barrier).
  __threadfence_system();
  if (!barrier(a, 2 * e)) return;
  // 3. every slice's reduced piece from my buffer into the output
  for (u32 s = 0; s < a.world; s++) {
    piece_of((u64)s * a.slice, a.slice, a.piece, a.nbytes, &lo, &hi);
    copy_range(a.output + lo, mine + lo, hi - lo, a.vec != 0, sizeof(T));
  }
  epoch_end(a, e);
}

template <typename E, int OP>
__device__ void reduce_scatter(const Args& a) {
  typedef typename E::T T;
  const u32 e = epoch_begin(a);
  const u64 data_off = DATA_OFF + (u64)(e & 1) * a.cap;
  const u64 mine = a.bufs[a.rank] + data_off;
  const u64 n = a.nbytes;
  u64 lo, hi;
  piece_of(0, n, a.piece, n, &lo, &hi);
  for (u32 s = 0; s < a.world; s++)
    copy_range(mine + (u64)s * n + lo, a.input + (u64)s * n + lo, hi - lo, a.vec != 0, sizeof(T));
  if (!barrier(a, 2 * e)) return;
  const u64 src = (u64)a.rank * n;
  const u64 vend = a.vec ? lo + ((hi - lo) / 16) * 16 : lo;
  const u64 step = (u64)blockDim.x * 16;
  for (u64 off = lo + threadIdx.x * 16; off < vend; off += step)
    *(uint4*)(a.output + off) = reduce16<E, OP>(a, data_off, src + off);
  for (u64 off = vend + threadIdx.x * sizeof(T); off < hi; off += (u64)blockDim.x * sizeof(T))
    *(T*)(a.output + off) = reduce1<E, OP>(a, data_off, src + off);
  epoch_end(a, e);
}

extern "C" __global__ void __launch_bounds__(512) rustccl_ag(const __grid_constant__ Args a) {
  const u32 e = epoch_begin(a);
  const u64 data_off = DATA_OFF + (u64)(e & 1) * a.cap;
  const u64 n = a.nbytes;
  u64 lo, hi;
  piece_of(0, n, a.piece, n, &lo, &hi);
  copy_w(a.bufs[a.rank] + data_off + lo, a.input + lo, hi - lo, a.vec);
  if (!barrier(a, 2 * e)) return;
  for (u32 s = 0; s < a.world; s++) copy_w(a.output + (u64)s * n + lo, a.bufs[s] + data_off + lo, hi - lo, a.vec);
  epoch_end(a, e);
}

#define RUSTCCL_KERNEL(KIND, NAME, E, OPNAME, OP) \
  extern "C" __global__ void __launch_bounds__(512) rustccl_##KIND##_##NAME##_##OPNAME(const __grid_constant__ Args a) { KIND<E, OP>(a); }
#define RUSTCCL_KINDS(NAME, E, OPNAME, OP)             \
  RUSTCCL_KERNEL(one_shot, NAME, E, OPNAME, OP)        \
  RUSTCCL_KERNEL(two_shot, NAME, E, OPNAME, OP)        \
  RUSTCCL_KERNEL(reduce_scatter, NAME, E, OPNAME, OP)
#define RUSTCCL_AR(NAME, E)            \
  RUSTCCL_KINDS(NAME, E, sum, 0)       \
  RUSTCCL_KINDS(NAME, E, avg, 1)       \
  RUSTCCL_KINDS(NAME, E, prod, 2)      \
  RUSTCCL_KINDS(NAME, E, min, 3)       \
  RUSTCCL_KINDS(NAME, E, max, 4)

RUSTCCL_AR(f32, F32)
RUSTCCL_AR(f64, F64)
RUSTCCL_AR(f16, F16)
RUSTCCL_AR(bf16, BF16)
RUSTCCL_AR(i32, I32)
RUSTCCL_AR(i64, I64)
