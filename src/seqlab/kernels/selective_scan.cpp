// seqlab's fused CPU selective scan (Mamba, Gu & Dao 2023, arXiv 2312.00752, Algorithm 2): forward and backward.
//
// Notation as in seqlab/layers/scan.py: b batch, t time, d channels, n state size. Every tensor is contiguous
// and batch-first: u, delta, z (b, t, d); A (d, n); B, C (b, t, n); D, delta_bias (d); h0 (b, d, n).
//
//   Δ_i = softplus(delta_i + delta_bias)          (bias and softplus optional)
//   Ā_i = exp(Δ_i A)                               (d, n), elementwise
//   h_i = Ā_i ⊙ h_{i-1} + Δ_i u_i B_i              (d, n)
//   y_i = (⟨h_i, C_i⟩_n + D u_i) ⊙ silu(z_i)       (d)
//
// The work is cut into tasks of one batch row × W channels (one cache line of each input row). A task walks
// the whole sequence with its state, n × W values with the channels innermost, in a local buffer, so that
// every inner loop is a W-wide vector loop over contiguous channels; tasks run on at::parallel_for's threads.
// The forward keeps only the state entering each chunk of L positions, (b, ⌈t/L⌉, n, d); the backward walks
// the chunks last to first, recomputes a chunk's states and Ā from its saved state, then runs the adjoint
// recurrence backwards through it (the derivation: docs/scan.md). Memory is never O(b·t·d·n).
//
// exp, softplus and sigmoid come from vec_math.h: branch-free polynomials, so that the vector loops vectorize.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "vec_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using seqlab_vec::exp_, seqlab_vec::sigmoid_, seqlab_vec::softplus_;

// ---------------------------------------------------------------------------------------------------------------
// One call's inputs and one task's channel block
// ---------------------------------------------------------------------------------------------------------------

template <typename T>
struct Scan {  // raw pointers into the tensors; D, z, bias null when not given
  const T *u, *delta, *A, *B, *C, *D, *z, *bias;
  int64_t b, t, d, n, L, nc;  // L positions per chunk, nc = ⌈t / L⌉ chunks
  bool softplus;
  int64_t lda;  // A's row length: n, or 1 for one A per channel shared by its n states (Mamba-2's SSD)
  int64_t ldz, ldB, ldC;  // row strides of z, B, C: views of the block's projections need no copy
};

// std::vector's allocator for the kernel's scratch: 64-byte aligned, so that each W-wide row is one cache line
// (malloc's 16-byte alignment made most vector loads and stores straddle two lines)
template <typename T>
struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const CacheAligned<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheAligned<U>&) const { return false; }
};
template <typename T>
using Lines = std::vector<T, CacheAligned<T>>;

// SEQLAB_VEC_INLINE (vec_math.h) on the small helpers: GCC left copy_in a call, 4% of the backward

// m ≤ W values into a W-wide buffer, zero past m, and back. A full block (m = W, all but the last channel
// block) is one vector load or store; std::copy made it a call to memmove for every row of every position.
template <typename T, int W>
SEQLAB_VEC_INLINE void copy_in(const T* __restrict__ src, int64_t m, T* __restrict__ dst) {
  if (m == W) {
#pragma omp simd
    for (int c = 0; c < W; ++c) dst[c] = src[c];
  } else {
    for (int c = 0; c < W; ++c) dst[c] = c < m ? src[c] : T(0);
  }
}

template <typename T, int W>
SEQLAB_VEC_INLINE void copy_out(const T* __restrict__ src, int64_t m, T* __restrict__ dst) {
  if (m == W) {
#pragma omp simd
    for (int c = 0; c < W; ++c) dst[c] = src[c];
  } else {
    for (int64_t c = 0; c < m; ++c) dst[c] = src[c];
  }
}

// `rows` rows of W values, `stride` apart in the source, zero past the m valid channels (and back)
template <typename T, int W>
SEQLAB_VEC_INLINE void load_rows(const T* src, int64_t stride, int64_t rows, int64_t m, T* dst) {
  for (int64_t k = 0; k < rows; ++k) copy_in<T, W>(src + k * stride, m, dst + k * W);
}

template <typename T, int W>
SEQLAB_VEC_INLINE void store_rows(const T* src, int64_t stride, int64_t rows, int64_t m, T* dst) {
  for (int64_t k = 0; k < rows; ++k) copy_out<T, W>(src + k * W, m, dst + k * stride);
}

// (W channels, n) of a (b, d, n) state, transposed into (n, W) and back
template <typename T, int W>
inline void load_state(const T* src, int64_t n, int64_t m, T* h) {
  std::fill(h, h + n * W, T(0));
  for (int64_t c = 0; c < m; ++c)
    for (int64_t k = 0; k < n; ++k) h[k * W + c] = src[c * n + k];
}

template <typename T, int W>
inline void store_state(const T* h, int64_t n, int64_t m, T* dst) {
  for (int64_t c = 0; c < m; ++c)
    for (int64_t k = 0; k < n; ++k) dst[c * n + k] = h[k * W + c];
}


template <typename T, int W>
SEQLAB_VEC_INLINE void load_row(const T* src, int64_t m, T* dst) {
  load_rows<T, W>(src, 0, 1, m, dst);
}

// How many positions ahead the passes over a chunk's positions ask for the rows they will read: a task reads one
// 64-byte piece of each (b, t, d) row, rows d values apart (z a view into a row twice as wide), a stride the
// hardware prefetcher follows poorly: at d = 512 the prefetch made the forward 1.22x and the backward 1.10x
// faster, at the lab's d = 104 2-4% (and when the recurrence read its rows itself, a tenth of a profile sat on
// those loads).
constexpr int64_t kAhead = 8;

template <typename T>
constexpr int kWidth = 64 / sizeof(T);  // channels per task: one 64-byte cache line of each (b, t, d) row

template <typename T, int W>
struct Block {  // batch row bi, channels c0 .. c0 + m - 1 (block j of ⌈d / W⌉), constants padded to W
  int64_t bi, j, c0, m;
  T* At;  // Aᵀ of these channels, (n, W), in the caller's zeroed buffer; zero past m, so the padded lanes keep h = 0
  alignas(64) T Dv[W] = {}, bias[W] = {};

  Block(const Scan<T>& s, int64_t bi, int64_t j, T* at)
      : bi(bi), j(j), c0(j * W), m(std::min<int64_t>(W, s.d - j * W)), At(at) {
    for (int64_t c = 0; c < m; ++c) {
      for (int64_t k = 0; k < s.n; ++k) At[k * W + c] = s.A[(c0 + c) * s.lda + (s.lda == 1 ? 0 : k)];
      if (s.D) Dv[c] = s.D[c0 + c];
      if (s.bias) bias[c] = s.bias[c0 + c];
    }
  }
  int64_t row(const Scan<T>& s, int64_t i) const { return (bi * s.t + i) * s.d + c0; }  // (bi, i, c0) in (b, t, d)
  int64_t bt(const Scan<T>& s, int64_t i) const { return (bi * s.t + i) * s.n; }       // (bi, i, 0) in (b, t, n)
  int64_t pos(const Scan<T>& s, int64_t i) const { return bi * s.t + i; }              // (bi, i) as one row index
};

// The tasks: each takes one batch row and a group of neighbouring channel blocks, and walks the sequence chunk by
// chunk, every block of its group through a chunk before the next chunk, so that the group's blocks read and write
// the same rows of (b, t, d) tensors while those are in cache. With one block a task (a 64-byte piece of each row,
// the rows d values apart, each task walking the whole sequence alone), a profile put a seventh of the backward on
// stalled loads of those rows: at the lab's d = 104 a row is 416 bytes, so half the pieces straddle two cache
// lines, each line fetched by two tasks at different times. Grouped, the lab's scan (b 8, t 1024, d 104) ran its
// forward + backward 1.1x faster.
// Groups are as large as still leaves about four tasks a thread, and at most kMaxGroup blocks: at d = 512 (b 16,
// t 256) a group of a whole row's 32 blocks ran 0.9x one of 8 on one thread (a chunk's rows of the eight (b, t, d)
// tensors then outgrow the cache), where the scan is bound by its strided loads and neither helps much.
constexpr int64_t kMaxGroup = 8;

struct Groups {
  int64_t blocks, size, per_row, tasks;
  Groups(int64_t b, int64_t d, int64_t width, int64_t threads) {
    blocks = (d + width - 1) / width;
    const int64_t want = std::max<int64_t>(1, 4 * threads);  // tasks
    size = std::clamp<int64_t>((blocks * b + want - 1) / want, 1, std::min<int64_t>(blocks, kMaxGroup));
    per_row = (blocks + size - 1) / size;
    size = (blocks + per_row - 1) / per_row;  // even groups: 7 blocks in two groups are 4 + 3, not 6 + 1
    tasks = b * per_row;
  }
  int64_t row(int64_t task) const { return task / per_row; }
  int64_t first(int64_t task) const { return (task % per_row) * size; }
  int64_t last(int64_t task) const { return std::min(first(task) + size, blocks); }  // one past
};

// x = softplus(x) and out = σ(x) over `rows` W-wide rows. With AVX-512 and 16 floats, four rows at a time
// through vec_math.h's interleaved forms: one row's softplus is a ~100-cycle dependent chain, and issued one row
// after another the out-of-order window overlapped too few of them (the forward's softplus pass ran at ~90
// cycles a row, latency-bound).
template <typename T, int W, typename F4, typename F1, typename Fs>
inline void map_rows(const T* x, int64_t rows, T* out, F4 four, F1 one, Fs each) {
  int64_t r = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && W == 16) {
    for (; r + 4 <= rows; r += 4) {
      __m512 v[4];
      for (int q = 0; q < 4; ++q) v[q] = _mm512_loadu_ps(x + (r + q) * 16);
      four(v);
      for (int q = 0; q < 4; ++q) _mm512_storeu_ps(out + (r + q) * 16, v[q]);
    }
    for (; r < rows; ++r) _mm512_storeu_ps(out + r * 16, one(_mm512_loadu_ps(x + r * 16)));
  }
#endif
  for (; r < rows; ++r) {
#pragma omp simd
    for (int c = 0; c < W; ++c) out[r * W + c] = each(x[r * W + c]);
  }
}

#if defined(__AVX512F__)
// vec_math.h's AVX-512 forms of `name` for map_rows: four rows at a time, and one row
#define SEQLAB_VEC_FNS(name) \
  [](__m512(&v)[4]) { seqlab_vec::name##16n<4>(v); }, [](__m512 v) { return seqlab_vec::name##16(v); }
#else
#define SEQLAB_VEC_FNS(name) 0, 0
#endif

template <typename T, int W>
inline void softplus_rows(T* x, int64_t rows) {
  map_rows<T, W>(x, rows, x, SEQLAB_VEC_FNS(softplus), [](T v) { return softplus_(v); });
}

template <typename T, int W>
inline void sigmoid_rows(const T* x, int64_t rows, T* out) {
  map_rows<T, W>(x, rows, out, SEQLAB_VEC_FNS(sigmoid), [](T v) { return sigmoid_(v); });
}

// delta_i + bias and u_i for the block's channels, positions s0 .. e - 1 into (e - s0, W) rows, zero past m
template <typename T, int W>
inline void load_inputs(const Scan<T>& s, const Block<T, W>& k, int64_t s0, int64_t e, T* raw, T* uv) {
  for (int64_t i = s0; i < e; ++i) {
    if (i + kAhead < s.t) {
      __builtin_prefetch(s.u + k.row(s, i + kAhead));
      __builtin_prefetch(s.delta + k.row(s, i + kAhead));
    }
    T* r = raw + (i - s0) * W;
    load_row<T, W>(s.delta + k.row(s, i), k.m, r);
    load_row<T, W>(s.u + k.row(s, i), k.m, uv + (i - s0) * W);
#pragma omp simd
    for (int c = 0; c < W; ++c) r[c] += k.bias[c];
  }
}

// Δ = softplus(delta + bias) (or delta + bias without softplus) of the rows `raw`, into dt; zero past m
template <typename T, int W>
inline void make_delta(const Scan<T>& s, const Block<T, W>& k, int64_t rows, const T* raw, T* dt) {
  if (dt != raw) std::copy(raw, raw + rows * W, dt);
  if (s.softplus) softplus_rows<T, W>(dt, rows);
  if (k.m < W)
    for (int64_t r = 0; r < rows; ++r) std::fill(dt + r * W + k.m, dt + (r + 1) * W, T(0));
}

// z and σ(z) of positions s0 .. e - 1, (e - s0, W) rows each
template <typename T, int W>
inline void load_gate(const Scan<T>& s, const Block<T, W>& k, int64_t s0, int64_t e, T* zv, T* sg) {
  for (int64_t i = s0; i < e; ++i) {
    if (i + kAhead < e) __builtin_prefetch(s.z + k.pos(s, i + kAhead) * s.ldz + k.c0);
    load_row<T, W>(s.z + k.pos(s, i) * s.ldz + k.c0, k.m, zv + (i - s0) * W);
  }
  sigmoid_rows<T, W>(zv, e - s0, sg);
}

// ---------------------------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------------------------

// One position of one block, for each state index k (vectors over the W channels):
//   Ā = exp(Δ A_k),  h_k = Ā ⊙ hprev_k + Δ u B_k,  y += h_k C_k
// hprev may be h (in place). With Store, Ā is kept in abar (n, W) for the backward.
#if defined(__AVX512F__)
// forward_position for 16 floats, in AVX-512 intrinsics: the exp (exp16) in half the instructions of exp_, four
// state rows' exps interleaved (exp16n: the lab's scan 1.05x faster than one exp after another)
template <bool Store>
SEQLAB_VEC_INLINE void forward_position16(const Scan<float>& s, const float* At, const float* dt, const float* uv,
                                          int64_t pos, const float* hprev, float* h, float* abar, float* y) {
  const float *Bi = s.B + pos * s.ldB, *Ci = s.C + pos * s.ldC;
  const __m512 vdt = _mm512_loadu_ps(dt), du = _mm512_mul_ps(vdt, _mm512_loadu_ps(uv));
  __m512 acc = _mm512_setzero_ps();
  int64_t k = 0;
  if (s.lda == 1) {  // one Ā for every state of a channel: one exp a position, not n
    const __m512 a = seqlab_vec::exp16(_mm512_mul_ps(vdt, _mm512_loadu_ps(At)));
    for (; k < s.n; ++k) {
      const __m512 hv = _mm512_fmadd_ps(a, _mm512_loadu_ps(hprev + k * 16), _mm512_mul_ps(du, _mm512_set1_ps(Bi[k])));
      _mm512_storeu_ps(h + k * 16, hv);
      acc = _mm512_fmadd_ps(hv, _mm512_set1_ps(Ci[k]), acc);
    }
    if constexpr (Store) _mm512_storeu_ps(abar, a);  // one row: the adjoint reads row 0 only (adjoint_shared)
  }
  for (; k + 4 <= s.n; k += 4) {
    __m512 a[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) a[q] = _mm512_mul_ps(vdt, _mm512_loadu_ps(At + (k + q) * 16));
    seqlab_vec::exp16n<4>(a);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __m512 bu = _mm512_mul_ps(du, _mm512_set1_ps(Bi[k + q]));
      const __m512 hv = _mm512_fmadd_ps(a[q], _mm512_loadu_ps(hprev + (k + q) * 16), bu);
      _mm512_storeu_ps(h + (k + q) * 16, hv);
      acc = _mm512_fmadd_ps(hv, _mm512_set1_ps(Ci[k + q]), acc);
      if constexpr (Store) _mm512_storeu_ps(abar + (k + q) * 16, a[q]);
    }
  }
  for (; k < s.n; ++k) {
    const __m512 a = seqlab_vec::exp16(_mm512_mul_ps(vdt, _mm512_loadu_ps(At + k * 16)));
    const __m512 hv = _mm512_fmadd_ps(a, _mm512_loadu_ps(hprev + k * 16), _mm512_mul_ps(du, _mm512_set1_ps(Bi[k])));
    _mm512_storeu_ps(h + k * 16, hv);
    acc = _mm512_fmadd_ps(hv, _mm512_set1_ps(Ci[k]), acc);
    if constexpr (Store) _mm512_storeu_ps(abar + k * 16, a);
  }
  _mm512_storeu_ps(y, acc);
}
#endif

template <typename T, int W, bool Store>
inline void forward_position(const Scan<T>& s, const T* At, const T* dt, const T* uv, int64_t pos, const T* hprev,
                             T* h, T* abar, T* y) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && W == 16) {
    forward_position16<Store>(s, At, dt, uv, pos, hprev, h, abar, y);
    return;
  }
#endif
  const T *Bi = s.B + pos * s.ldB, *Ci = s.C + pos * s.ldC;
  alignas(64) T du[W], acc[W];  // y is summed in a local: through the pointer, GCC kept it in memory, a load-add-store chain
#pragma omp simd
  for (int c = 0; c < W; ++c) du[c] = dt[c] * uv[c], acc[c] = 0;
  alignas(64) T shared[W];  // with one A per channel (lda 1), its Ā for all n states: one exp a position, not n
  if (s.lda == 1) {
#pragma omp simd
    for (int c = 0; c < W; ++c) shared[c] = exp_(dt[c] * At[c]);
    if constexpr (Store) std::copy(shared, shared + W, abar);  // one row (adjoint_shared)
  }
  for (int64_t k = 0; k < s.n; ++k) {
    const T bk = Bi[k], ck = Ci[k];
    const T *ak = At + k * W, *hp = hprev + k * W;
    T* hk = h + k * W;
    if (s.lda == 1) {
#pragma omp simd
      for (int c = 0; c < W; ++c) {
        const T hv = shared[c] * hp[c] + du[c] * bk;
        hk[c] = hv;
        acc[c] += hv * ck;
      }
      continue;
    }
#pragma omp simd
    for (int c = 0; c < W; ++c) {
      const T a = exp_(dt[c] * ak[c]);  // every exponent Δ A ≤ 0 for Δ ≥ 0, A ≤ 0
      const T hv = a * hp[c] + du[c] * bk;
      hk[c] = hv;
      acc[c] += hv * ck;
      if constexpr (Store) abar[k * W + c] = a;
    }
  }
#pragma omp simd
  for (int c = 0; c < W; ++c) y[c] = acc[c];
}

// out_i = (y + D u) ⊙ silu(z) for positions s0 .. e - 1, the m valid channels (zv, sg: scratch rows)
template <typename T, int W>
inline void finish_chunk(const Scan<T>& s, const Block<T, W>& k, int64_t s0, int64_t e, const T* uv, const T* y,
                         T* zv, T* sg, T* out) {
  if (s.z) load_gate(s, k, s0, e, zv, sg);
  for (int64_t i = s0; i < e; ++i) {
    const int64_t l = (i - s0) * W;
    alignas(64) T o[W];
#pragma omp simd
    for (int c = 0; c < W; ++c) o[c] = y[l + c] + k.Dv[c] * uv[l + c];
    if (s.z) {
#pragma omp simd
      for (int c = 0; c < W; ++c) o[c] *= zv[l + c] * sg[l + c];
    }
    copy_out<T, W>(o, k.m, out + k.row(s, i));
  }
}

// One task's whole sequence: y (b, t, d), the last state (b, d, n), the state entering each chunk (b, nc, n, d).
// Each block's chunk in three passes: Δ and u of all its positions, the recurrence, the outputs. The first and last
// are independent from one position to the next, so their softplus and sigmoid overlap; interleaved with the
// recurrence, each position's softplus sat on the recurrence's critical path (4/10 of the forward's time).
template <typename T, int W>
void forward_task(const Scan<T>& s, const Groups& plan, const T* h0, int64_t task, T* y, T* h_last, T* bounds) {
  const int64_t bi = plan.row(task), j0 = plan.first(task), nb = plan.last(task) - j0, nW = s.n * W;
  Lines<T> At(nb * nW, T(0)), h(nb * nW, T(0)), DT(s.L * W), UV(s.L * W), Y(s.L * W), Z(s.L * W), SG(s.L * W);
  std::vector<Block<T, W>> ks;
  ks.reserve(nb);
  for (int64_t j = 0; j < nb; ++j) {
    const Block<T, W>& k = ks.emplace_back(s, bi, j0 + j, At.data() + j * nW);
    if (h0) load_state<T, W>(h0 + (bi * s.d + k.c0) * s.n, s.n, k.m, h.data() + j * nW);
  }
  for (int64_t s0 = 0; s0 < s.t; s0 += s.L) {
    const int64_t e = std::min(s0 + s.L, s.t);
    for (int64_t j = 0; j < nb; ++j) {
      const Block<T, W>& k = ks[j];
      T* hj = h.data() + j * nW;
      store_rows<T, W>(hj, s.d, s.n, k.m, bounds + (bi * s.nc + s0 / s.L) * s.n * s.d + k.c0);
      load_inputs(s, k, s0, e, DT.data(), UV.data());
      make_delta(s, k, e - s0, DT.data(), DT.data());
      for (int64_t i = s0; i < e; ++i) {
        const int64_t l = (i - s0) * W;
        forward_position<T, W, false>(s, k.At, DT.data() + l, UV.data() + l, k.pos(s, i), hj, hj, nullptr,
                                      Y.data() + l);
      }
      finish_chunk(s, k, s0, e, UV.data(), Y.data(), Z.data(), SG.data(), y);
    }
  }
  for (int64_t j = 0; j < nb; ++j)
    store_state<T, W>(h.data() + j * nW, s.n, ks[j].m, h_last + (bi * s.d + ks[j].c0) * s.n);
}

// ---------------------------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------------------------

// out[k] += Σ_c x[k W + c] for the rows k < rows of a (rows, W) buffer: the backward's sums over channels.
// Written as one tree per row, GCC kept the partial sums on the stack and added them one by one (a third of the
// backward's time). With AVX-512 and W = 16 floats, 16 rows are summed at once: four levels of 128-bit lane and
// element shuffles, each adding half of every row's remaining terms and packing two rows' halves into one
// register, leave row k's sum in element k (15 additions for 16 rows instead of 16 × 4 horizontal ones).
template <typename T, int W>
inline void add_row_sums(const T* x, int64_t rows, T* out) {
  for (int64_t k = 0; k < rows; ++k) {
    alignas(64) T v[W];
#pragma omp simd
    for (int c = 0; c < W; ++c) v[c] = x[k * W + c];
    for (int half = W / 2; half >= 1; half /= 2)
      for (int c = 0; c < half; ++c) v[c] += v[c + half];
    out[k] += v[0];
  }
}

#if defined(__AVX512F__)
// 16 rows of 16 floats -> their 16 sums, row k's in element k
SEQLAB_VEC_INLINE __m512 sums16r(const __m512 (&v)[16]) {  // the rows in registers
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // rows 2i, 2i+1 -> their 128-bit lanes (0 + 2, 1 + 3): [2i: 8 | 2i+1: 8]
    const __m512 r = v[2 * i], s = v[2 * i + 1];
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r, s, 0x44), _mm512_shuffle_f32x4(r, s, 0xEE));
  }
  for (int i = 0; i < 4; ++i)  // lanes (0 + 1, 2 + 3) of a pair -> [4i: 4 | 4i+1: 4 | 4i+2: 4 | 4i+3: 4]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // within each lane l, rows l of b[2i] and b[2i+1]: elements (0 + 2, 1 + 3)
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  // elements (0 + 1, 2 + 3): lane l holds the sums of rows l, 4 + l, 8 + l, 12 + l
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, d);
}

SEQLAB_VEC_INLINE __m512 sums16(const float* x) {
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_ps(x + 16 * i);
  return sums16r(v);
}

template <>
SEQLAB_VEC_INLINE void add_row_sums<float, 16>(const float* x, int64_t rows, float* out) {
  int64_t k = 0;
  for (; k + 16 <= rows; k += 16) _mm512_storeu_ps(out + k, _mm512_add_ps(_mm512_loadu_ps(out + k), sums16(x + k * 16)));
  if (k < rows) {
    alignas(64) float rest[256] = {};
    std::copy(x + k * 16, x + rows * 16, rest);
    const __mmask16 mask = static_cast<__mmask16>((1u << (rows - k)) - 1);
    _mm512_mask_storeu_ps(out + k, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out + k), sums16(rest)));
  }
}
#endif

template <typename T>
struct Grads {  // incoming gradients and the outputs of the backward
  const T *dy, *dh_last, *bounds;  // dh_last null: no gradient reaches the last state
  T *du, *ddelta, *dz, *dh0;       // dz null when there is no gate
  T *dB_part, *dC_part;            // (slots, b, t, n), zeroed: each thread's share of the sums over d (scan_bwd)
  T *dA_part, *dD_part, *dbias_part;  // (b, n, d), (b, d), (b, d): each batch row's share of the sums over b, t
};

template <typename T, int W>
struct Work {  // one thread's buffers: a chunk's states H, Ā and per-position rows, and a task's running sums
  int64_t slot;                      // the thread's slice of dB_part and dC_part
  Lines<T> H, Ab, h0;                // a chunk's states and Ā, (L, n, W); the state entering it
  Lines<T> DT, UV, Y, GY, GB, DDT;   // (L, W) each: Δ, u, y + D u, gy, ⟨G, B⟩, ∂L/∂Δ of the chunk's positions
  Lines<T> RAW, Z, SG;               // (L, W) each: delta + bias (then its σ), z, σ(z)
  Lines<T> pB, pC;                   // one position's terms of ∂L/∂B, ∂L/∂C before the sums over channels
  // Each block of the task's group: Aᵀ, the adjoint g = Ā_{i+1} ⊙ G_{i+1} carried to position i and ∂L/∂A's sum,
  // (n, W) each; the sums of ∂L/∂D and ∂L/∂bias, W each. `select` points g, dA, dD, dbias at block j's.
  Lines<T> At, gs, dAs, dDs, dbiass;
  T *g = nullptr, *dA = nullptr, *dD = nullptr, *dbias = nullptr;
  Work(const Scan<T>& s, int64_t slot, int64_t blocks)
      : slot(slot), H(s.L * s.n * W), Ab(s.L * s.n * W), h0(s.n * W), DT(s.L * W), UV(s.L * W), Y(s.L * W),
        GY(s.L * W), GB(s.L * W), DDT(s.L * W), RAW(s.L * W), Z(s.L * W), SG(s.L * W), pB(s.n * W), pC(s.n * W),
        At(blocks * s.n * W), gs(blocks * s.n * W), dAs(blocks * s.n * W), dDs(blocks * W), dbiass(blocks * W) {}
  void select(int64_t j, int64_t n) {
    g = gs.data() + j * n * W, dA = dAs.data() + j * n * W, dD = dDs.data() + j * W, dbias = dbiass.data() + j * W;
  }
};

// The chunk's positions again from the state that entered it: H_i, Ā_i, Δ_i, u_i and y_i + D u_i (Δ and u first,
// for all positions: see forward_task); RAW holds σ(delta + bias) after a softplus, the softplus's derivative
template <typename T, int W>
void recompute_chunk(const Scan<T>& s, const Block<T, W>& k, const T* bounds, int64_t chunk, Work<T, W>& w) {
  const int64_t s0 = chunk * s.L, e = std::min(s0 + s.L, s.t), nW = s.n * W;
  load_rows<T, W>(bounds + (k.bi * s.nc + chunk) * s.n * s.d + k.c0, s.d, s.n, k.m, w.h0.data());
  load_inputs(s, k, s0, e, w.RAW.data(), w.UV.data());
  make_delta(s, k, e - s0, w.RAW.data(), w.DT.data());
  for (int64_t i = s0; i < e; ++i) {
    const int64_t l = i - s0;
    const T *dt = w.DT.data() + l * W, *uv = w.UV.data() + l * W;
    T* y = w.Y.data() + l * W;
    const T* hprev = l ? w.H.data() + (l - 1) * nW : w.h0.data();
    forward_position<T, W, true>(s, k.At, dt, uv, k.pos(s, i), hprev, w.H.data() + l * nW, w.Ab.data() + l * nW, y);
#pragma omp simd
    for (int c = 0; c < W; ++c) y[c] += k.Dv[c] * uv[c];
  }
  if (s.softplus) sigmoid_rows<T, W>(w.RAW.data(), e - s0, w.RAW.data());
}

// The gate: gy = ∂L/∂(⟨h, C⟩ + D u) = dy silu(z), ∂L/∂z = dy (⟨h, C⟩ + D u) silu'(z), silu' = σ (1 + z (1 - σ));
// ∂L/∂D += gy u. zv, sg: position i's z and σ(z) (load_gate).
template <typename T, int W>
inline void gate_backward(const Scan<T>& s, const Grads<T>& g, const Block<T, W>& k, int64_t i, const T* ypre,
                          const T* uv, const T* zv, const T* sg, T* gy, Work<T, W>& w) {
  if (i + kAhead < s.t) __builtin_prefetch(g.dy + k.row(s, i + kAhead));
  load_row<T, W>(g.dy + k.row(s, i), k.m, gy);
  if (s.z) {
    alignas(64) T dz[W];
#pragma omp simd
    for (int c = 0; c < W; ++c) {
      dz[c] = gy[c] * ypre[c] * sg[c] * (1 + zv[c] * (1 - sg[c]));
      gy[c] *= zv[c] * sg[c];
    }
    copy_out<T, W>(dz, k.m, g.dz + k.row(s, i));
  }
#pragma omp simd
  for (int c = 0; c < W; ++c) w.dD[c] += gy[c] * uv[c];
}

template <typename T>
struct Position {  // what the adjoint step reads at one position (vectors over the W channels)
  const T *Bi, *Ci, *dt, *uv, *gy, *h, *hprev, *abar;
};

// The adjoint at one position, for each state index k (vectors over the W channels; docs/scan.md):
//   G = gy C_k + g_k                      ∂L/∂h_i, with g = Ā_{i+1} ⊙ G_{i+1} carried from position i + 1
//   ∂L/∂C_k = Σ_c gy h_k,  ∂L/∂B_k = Σ_c Δ u G,  ⟨G, B⟩ += G B_k
//   ∂L/∂(Δ A_k) = G ⊙ h_{i-1,k} ⊙ Ā:  ∂L/∂Δ += it A_k,  ∂L/∂A_k += it Δ
//   g_k ← Ā ⊙ G                           carried to position i - 1
#if defined(__AVX512F__)
// adjoint_position for 16 floats, in AVX-512 intrinsics (GCC reloaded the pointers from the stack in the generic loop)
SEQLAB_VEC_INLINE void adjoint_position16(const Scan<float>& s, const float* __restrict__ At,
                                          const Position<float>& p, float* __restrict__ g, float* __restrict__ dA,
                                          float* __restrict__ pC, float* __restrict__ pB, float* dBrow, float* dCrow,
                                          float* gb, float* ddt) {
  const __m512 dt = _mm512_loadu_ps(p.dt), gy = _mm512_loadu_ps(p.gy), du = _mm512_mul_ps(dt, _mm512_loadu_ps(p.uv));
  __m512 gbv = _mm512_setzero_ps(), ddtv = _mm512_setzero_ps();
  for (int64_t k = 0, o = 0; k < s.n; ++k, o += 16) {
    const __m512 a = _mm512_loadu_ps(p.abar + o), gk = _mm512_loadu_ps(g + o);
    const __m512 G = _mm512_fmadd_ps(gy, _mm512_set1_ps(p.Ci[k]), gk);
    _mm512_storeu_ps(pC + o, _mm512_mul_ps(gy, _mm512_loadu_ps(p.h + o)));
    _mm512_storeu_ps(pB + o, _mm512_mul_ps(du, G));
    gbv = _mm512_fmadd_ps(G, _mm512_set1_ps(p.Bi[k]), gbv);
    const __m512 dl = _mm512_mul_ps(_mm512_mul_ps(G, _mm512_loadu_ps(p.hprev + o)), a);
    ddtv = _mm512_fmadd_ps(dl, _mm512_loadu_ps(At + o), ddtv);
    _mm512_storeu_ps(dA + o, _mm512_fmadd_ps(dl, dt, _mm512_loadu_ps(dA + o)));
    _mm512_storeu_ps(g + o, _mm512_mul_ps(a, G));
  }
  _mm512_storeu_ps(gb, gbv);
  _mm512_storeu_ps(ddt, ddtv);
  add_row_sums<float, 16>(pC, s.n, dCrow);
  add_row_sums<float, 16>(pB, s.n, dBrow);
}
#endif

#if defined(__AVX512F__)
// adjoint_shared for 16 floats: 16 states at a time, their ∂L/∂C and ∂L/∂B terms summed over the channels from
// registers (sums16r) instead of written to pC and pB and read back; the rest of n through those rows
SEQLAB_VEC_INLINE void adjoint_shared16(const Scan<float>& s, const float* __restrict__ At, const Position<float>& p,
                                        float* __restrict__ g, float* __restrict__ dA, float* __restrict__ pC,
                                        float* __restrict__ pB, float* dBrow, float* dCrow, float* gb, float* ddt) {
  const __m512 dt = _mm512_loadu_ps(p.dt), gy = _mm512_loadu_ps(p.gy), a = _mm512_loadu_ps(p.abar);
  const __m512 du = _mm512_mul_ps(dt, _mm512_loadu_ps(p.uv));
  __m512 gbv = _mm512_setzero_ps(), dls = _mm512_setzero_ps();
  auto state = [&](int64_t k, __m512& pb) {  // G, g ← Ā G, the sums; pb = Δ u G
    const int64_t o = k * 16;
    const __m512 G = _mm512_fmadd_ps(gy, _mm512_set1_ps(p.Ci[k]), _mm512_loadu_ps(g + o));
    pb = _mm512_mul_ps(du, G);
    gbv = _mm512_fmadd_ps(G, _mm512_set1_ps(p.Bi[k]), gbv);
    dls = _mm512_fmadd_ps(G, _mm512_loadu_ps(p.hprev + o), dls);
    _mm512_storeu_ps(g + o, _mm512_mul_ps(a, G));
  };
  int64_t k = 0;
  for (; k + 16 <= s.n; k += 16) {
    __m512 v[16];
    for (int q = 0; q < 16; ++q) v[q] = _mm512_mul_ps(gy, _mm512_loadu_ps(p.h + (k + q) * 16));
    _mm512_storeu_ps(dCrow + k, _mm512_add_ps(_mm512_loadu_ps(dCrow + k), sums16r(v)));
    for (int q = 0; q < 16; ++q) state(k + q, v[q]);
    _mm512_storeu_ps(dBrow + k, _mm512_add_ps(_mm512_loadu_ps(dBrow + k), sums16r(v)));
  }
  const int64_t k0 = k;
  for (; k < s.n; ++k) {
    __m512 pb;
    state(k, pb);
    _mm512_storeu_ps(pB + (k - k0) * 16, pb);
    _mm512_storeu_ps(pC + (k - k0) * 16, _mm512_mul_ps(gy, _mm512_loadu_ps(p.h + k * 16)));
  }
  if (k0 < s.n) {
    add_row_sums<float, 16>(pC, s.n - k0, dCrow + k0);
    add_row_sums<float, 16>(pB, s.n - k0, dBrow + k0);
  }
  const __m512 dl = _mm512_mul_ps(dls, a);
  _mm512_storeu_ps(gb, gbv);
  _mm512_storeu_ps(ddt, _mm512_mul_ps(dl, _mm512_loadu_ps(At)));
  _mm512_storeu_ps(dA, _mm512_fmadd_ps(dl, dt, _mm512_loadu_ps(dA)));
}
#endif

// The adjoint with one Ā per channel (lda 1; p.abar holds it in one row): ∂L/∂(Δ A) = Ā ⊙ Σ_k G h_{i-1,k} is one
// sum over the states, so ∂L/∂Δ and ∂L/∂A take one vector each instead of a row per state (dA's row 0 holds the
// channel's sum; the rows are added into the (d, 1) gradient)
template <typename T, int W>
inline void adjoint_shared(const Scan<T>& s, const T* At, const Position<T>& p, Work<T, W>& w, T* dBrow, T* dCrow,
                           T* gb, T* ddt) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && W == 16) {
    adjoint_shared16(s, At, p, w.g, w.dA, w.pC.data(), w.pB.data(), dBrow, dCrow, gb, ddt);
    return;
  }
#endif
  alignas(64) T du[W], gbv[W], dls[W];
#pragma omp simd
  for (int c = 0; c < W; ++c) du[c] = p.dt[c] * p.uv[c], gbv[c] = 0, dls[c] = 0;
  for (int64_t k = 0; k < s.n; ++k) {
    const T bk = p.Bi[k], ck = p.Ci[k];
    const T *hk = p.h + k * W, *hp = p.hprev + k * W;
    T *gk = w.g + k * W, *pC = w.pC.data() + k * W, *pB = w.pB.data() + k * W;
#pragma omp simd
    for (int c = 0; c < W; ++c) {
      const T G = p.gy[c] * ck + gk[c];
      pC[c] = p.gy[c] * hk[c];
      pB[c] = du[c] * G;
      gbv[c] += G * bk;
      dls[c] += G * hp[c];
      gk[c] = p.abar[c] * G;
    }
  }
#pragma omp simd
  for (int c = 0; c < W; ++c) {
    const T dl = dls[c] * p.abar[c];
    gb[c] = gbv[c], ddt[c] = dl * At[c];
    w.dA[c] += dl * p.dt[c];
  }
  add_row_sums<T, W>(w.pC.data(), s.n, dCrow);
  add_row_sums<T, W>(w.pB.data(), s.n, dBrow);
}

template <typename T, int W>
inline void adjoint_position(const Scan<T>& s, const T* At, const Position<T>& p, Work<T, W>& w, T* dBrow,
                             T* dCrow, T* gb, T* ddt) {
  if (s.lda == 1) {
    adjoint_shared(s, At, p, w, dBrow, dCrow, gb, ddt);
    return;
  }
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && W == 16) {
    adjoint_position16(s, At, p, w.g, w.dA, w.pC.data(), w.pB.data(), dBrow, dCrow, gb, ddt);
    return;
  }
#endif
  alignas(64) T du[W], gbv[W], ddtv[W];  // sums in locals, not through gb and ddt: see forward_position
#pragma omp simd
  for (int c = 0; c < W; ++c) du[c] = p.dt[c] * p.uv[c], gbv[c] = 0, ddtv[c] = 0;
  for (int64_t k = 0; k < s.n; ++k) {
    const T bk = p.Bi[k], ck = p.Ci[k];
    const T *ak = p.abar + k * W, *hk = p.h + k * W, *hp = p.hprev + k * W, *Ak = At + k * W;
    T *gk = w.g + k * W, *dAk = w.dA + k * W;
    T *pC = w.pC.data() + k * W, *pB = w.pB.data() + k * W;
#pragma omp simd
    for (int c = 0; c < W; ++c) {
      const T G = p.gy[c] * ck + gk[c];
      pC[c] = p.gy[c] * hk[c];
      pB[c] = du[c] * G;
      gbv[c] += G * bk;
      const T dl = G * hp[c] * ak[c];
      ddtv[c] += dl * Ak[c];
      dAk[c] += dl * p.dt[c];
      gk[c] = ak[c] * G;
    }
  }
#pragma omp simd
  for (int c = 0; c < W; ++c) gb[c] = gbv[c], ddt[c] = ddtv[c];
  add_row_sums<T, W>(w.pC.data(), s.n, dCrow);
  add_row_sums<T, W>(w.pB.data(), s.n, dBrow);
}

// ∂L/∂u = gy D + Δ ⟨G, B⟩;  ∂L/∂Δ += u ⟨G, B⟩;  ∂L/∂delta = ∂L/∂Δ σ(delta + bias) after a softplus;
// ∂L/∂delta_bias += ∂L/∂delta
template <typename T, int W>
inline void input_grads(const Scan<T>& s, const Grads<T>& g, const Block<T, W>& k, int64_t i, const T* dt, const T* uv,
                        const T* gy, const T* gb, const T* sig, T* ddt, Work<T, W>& w) {
  alignas(64) T du[W];
#pragma omp simd
  for (int c = 0; c < W; ++c) du[c] = gy[c] * k.Dv[c] + dt[c] * gb[c], ddt[c] += uv[c] * gb[c];
  if (s.softplus) {
#pragma omp simd
    for (int c = 0; c < W; ++c) ddt[c] *= sig[c];
  }
#pragma omp simd
  for (int c = 0; c < W; ++c) w.dbias[c] += ddt[c];
  copy_out<T, W>(du, k.m, g.du + k.row(s, i));
  copy_out<T, W>(ddt, k.m, g.ddelta + k.row(s, i));
}

// One chunk backwards, last position first; w.g enters as ∂L/∂h after the chunk and leaves as ∂L/∂h before it.
// ∂L/∂B and ∂L/∂C add into the calling thread's slice of dB_part and dC_part. The gate before the adjoint and the
// input gradients after it run as passes over the chunk's positions, off the adjoint's critical path.
template <typename T, int W>
void backward_chunk(const Scan<T>& s, const Grads<T>& g, const Block<T, W>& k, int64_t chunk, Work<T, W>& w) {
  recompute_chunk(s, k, g.bounds, chunk, w);
  const int64_t s0 = chunk * s.L, e = std::min(s0 + s.L, s.t), nW = s.n * W;
  if (s.z) load_gate(s, k, s0, e, w.Z.data(), w.SG.data());
  for (int64_t i = s0; i < e; ++i) {
    const int64_t l = (i - s0) * W;
    gate_backward(s, g, k, i, w.Y.data() + l, w.UV.data() + l, w.Z.data() + l, w.SG.data() + l, w.GY.data() + l, w);
  }
  for (int64_t i = e - 1; i >= s0; --i) {
    const int64_t l = i - s0, part = w.slot * s.b * s.t * s.n + k.bt(s, i);
    const T* hprev = l ? w.H.data() + (l - 1) * nW : w.h0.data();
    const Position<T> p{s.B + k.pos(s, i) * s.ldB, s.C + k.pos(s, i) * s.ldC, w.DT.data() + l * W,
                        w.UV.data() + l * W, w.GY.data() + l * W, w.H.data() + l * nW, hprev, w.Ab.data() + l * nW};
    adjoint_position(s, k.At, p, w, g.dB_part + part, g.dC_part + part, w.GB.data() + l * W, w.DDT.data() + l * W);
  }
  for (int64_t i = s0; i < e; ++i) {
    const int64_t l = i - s0;
    input_grads(s, g, k, i, w.DT.data() + l * W, w.UV.data() + l * W, w.GY.data() + l * W, w.GB.data() + l * W,
                w.RAW.data() + l * W, w.DDT.data() + l * W, w);
  }
}

// One task's whole sequence backwards, every block of its group through a chunk before the chunk before it; then
// ∂L/∂h0 = Ā_1 ⊙ G_1 and the blocks' shares of ∂L/∂A, ∂L/∂D, ∂L/∂bias
template <typename T, int W>
void backward_task(const Scan<T>& s, const Groups& plan, const Grads<T>& g, int64_t task, Work<T, W>& w) {
  const int64_t bi = plan.row(task), j0 = plan.first(task), nb = plan.last(task) - j0, nW = s.n * W;
  for (Lines<T>* x : {&w.At, &w.gs, &w.dAs, &w.dDs, &w.dbiass}) std::fill(x->begin(), x->end(), T(0));
  std::vector<Block<T, W>> ks;
  ks.reserve(nb);
  for (int64_t j = 0; j < nb; ++j) {
    const Block<T, W>& k = ks.emplace_back(s, bi, j0 + j, w.At.data() + j * nW);
    w.select(j, s.n);
    if (g.dh_last) load_state<T, W>(g.dh_last + (bi * s.d + k.c0) * s.n, s.n, k.m, w.g);
  }
  for (int64_t chunk = s.nc - 1; chunk >= 0; --chunk)
    for (int64_t j = 0; j < nb; ++j) {
      w.select(j, s.n);
      backward_chunk(s, g, ks[j], chunk, w);
    }
  for (int64_t j = 0; j < nb; ++j) {
    const Block<T, W>& k = ks[j];
    w.select(j, s.n);
    store_state<T, W>(w.g, s.n, k.m, g.dh0 + (bi * s.d + k.c0) * s.n);
    store_rows<T, W>(w.dA, s.d, s.n, k.m, g.dA_part + bi * s.n * s.d + k.c0);
    std::copy(w.dD, w.dD + k.m, g.dD_part + bi * s.d + k.c0);
    std::copy(w.dbias, w.dbias + k.m, g.dbias_part + bi * s.d + k.c0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The operators
// ---------------------------------------------------------------------------------------------------------------

void check(const Tensor& x, const Tensor& like, std::vector<int64_t> shape, const char* name) {
  TORCH_CHECK(x.sizes() == at::IntArrayRef(shape), name, " has shape ", x.sizes(), ", expected ", shape);
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.scalar_type() == like.scalar_type(), name,
              " must be a contiguous CPU tensor of u's dtype");
}

void check_optional(const OptTensor& x, const Tensor& like, std::vector<int64_t> shape, const char* name) {
  if (x && x->defined()) check(*x, like, std::move(shape), name);
}

// (b, t, m) with contiguous last dimension and rows evenly spaced: a view of a wider projection output is fine
void check_rows(const Tensor& x, const Tensor& like, std::vector<int64_t> shape, const char* name) {
  TORCH_CHECK(x.sizes() == at::IntArrayRef(shape), name, " has shape ", x.sizes(), ", expected ", shape);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == like.scalar_type() && x.stride(2) == 1 &&
                  x.stride(1) >= x.size(2) && x.stride(0) == x.size(1) * x.stride(1),
              name, " must be a CPU tensor of u's dtype with contiguous, evenly spaced rows");
}

void check_inputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                  const OptTensor& D, const OptTensor& z, const OptTensor& bias, int64_t chunk) {
  TORCH_CHECK(u.dim() == 3 && A.dim() == 2 && B.dim() == 3, "u must be (b, t, d), A (d, n) or (d, 1), B (b, t, n)");
  const int64_t b = u.size(0), t = u.size(1), d = u.size(2), n = B.size(2);
  TORCH_CHECK(chunk >= 1, "chunk must be positive, got ", chunk);
  check(u, u, {b, t, d}, "u");
  check(delta, u, {b, t, d}, "delta");
  check(A, u, {d, A.size(1) == 1 ? 1 : n}, "A");
  check_rows(B, u, {b, t, n}, "B");
  check_rows(C, u, {b, t, n}, "C");
  check_optional(D, u, {d}, "D");
  if (z && z->defined()) check_rows(*z, u, {b, t, d}, "z");
  check_optional(bias, u, {d}, "delta_bias");
}

template <typename T>
const T* ptr(const OptTensor& x) {
  return x && x->defined() ? x->data_ptr<T>() : nullptr;
}

template <typename T>
Scan<T> make_scan(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                  const OptTensor& D, const OptTensor& z, const OptTensor& bias, bool softplus, int64_t chunk) {
  const int64_t t = u.size(1);
  return Scan<T>{u.data_ptr<T>(), delta.data_ptr<T>(), A.data_ptr<T>(), B.data_ptr<T>(), C.data_ptr<T>(),
                 ptr<T>(D),       ptr<T>(z),           ptr<T>(bias),    u.size(0),       t,
                 u.size(2),       B.size(2),           chunk,           (t + chunk - 1) / chunk, softplus,
                 A.size(1),       z && z->defined() ? z->stride(1) : 0, B.stride(1), C.stride(1)};
}


// -> y (b, t, d), the last state (b, d, n), the state entering each chunk (b, ⌈t / chunk⌉, n, d)
std::vector<Tensor> scan_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                             const OptTensor& D, const OptTensor& z, const OptTensor& bias, const OptTensor& h0,
                             bool softplus, int64_t chunk) {
  check_inputs(u, delta, A, B, C, D, z, bias, chunk);
  const int64_t b = u.size(0), t = u.size(1), d = u.size(2), n = B.size(2);
  check_optional(h0, u, {b, d, n}, "h0");
  Tensor y = at::empty({b, t, d}, u.options()), h_last = at::empty({b, d, n}, u.options());
  Tensor bounds = at::empty({b, (t + chunk - 1) / chunk, n, d}, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "seqlab_scan_fwd", [&] {
    constexpr int W = kWidth<scalar_t>;
    const Scan<scalar_t> s = make_scan<scalar_t>(u, delta, A, B, C, D, z, bias, softplus, chunk);
    const Groups plan(b, d, W, at::get_num_threads());
    at::parallel_for(0, plan.tasks, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t task = lo; task < hi; ++task)
        forward_task<scalar_t, W>(s, plan, ptr<scalar_t>(h0), task, y.data_ptr<scalar_t>(), h_last.data_ptr<scalar_t>(),
                                  bounds.data_ptr<scalar_t>());
    });
  });
  return {y, h_last, bounds};
}

// -> ∂L/∂ u, delta, A, B, C, D, z (empty without a gate), delta_bias, h0
std::vector<Tensor> scan_bwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                             const OptTensor& D, const OptTensor& z, const OptTensor& bias, const Tensor& bounds,
                             const Tensor& dy, const OptTensor& dh_last, bool softplus, int64_t chunk) {
  check_inputs(u, delta, A, B, C, D, z, bias, chunk);
  const int64_t b = u.size(0), t = u.size(1), d = u.size(2), n = B.size(2), threads = at::get_num_threads();
  check(bounds, u, {b, (t + chunk - 1) / chunk, n, d}, "bounds");
  check(dy, u, {b, t, d}, "dy");
  check_optional(dh_last, u, {b, d, n}, "dh_last");
  const auto o = u.options();
  Tensor du = at::empty({b, t, d}, o), ddelta = at::empty({b, t, d}, o), dh0 = at::empty({b, d, n}, o);
  const bool gated = z && z->defined();
  Tensor dz = at::empty({gated ? b : 0, t, d}, o), dA = at::empty({b, n, d}, o), dD = at::empty({b, d}, o);
  // ∂L/∂B and ∂L/∂C sum over the channels: one slice per thread, added at the end, unless every batch row is one
  // task's (a whole row's channel blocks in one group, as at the lab's widths), when no two threads share a row
  const Groups plan(b, d, u.scalar_type() == at::kDouble ? kWidth<double> : kWidth<float>, threads);
  const bool own_rows = plan.per_row == 1;
  const int64_t slots = own_rows ? 1 : threads;
  Tensor dbias = at::empty({b, d}, o), dB = at::zeros({slots, b, t, n}, o), dC = at::zeros({slots, b, t, n}, o);
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "seqlab_scan_bwd", [&] {
    constexpr int W = kWidth<scalar_t>;
    const Scan<scalar_t> s = make_scan<scalar_t>(u, delta, A, B, C, D, z, bias, softplus, chunk);
    auto p = [](Tensor& x) { return x.numel() ? x.data_ptr<scalar_t>() : nullptr; };
    const Grads<scalar_t> g{dy.data_ptr<scalar_t>(), ptr<scalar_t>(dh_last), bounds.data_ptr<scalar_t>(),
                            p(du), p(ddelta), p(dz), p(dh0), p(dB), p(dC), p(dA), p(dD), p(dbias)};
    at::parallel_for(0, plan.tasks, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      const int64_t thread = at::get_thread_num();
      TORCH_CHECK(thread < threads, "thread ", thread, " of ", threads, ": called inside another parallel region?");
      Work<scalar_t, W> w(s, own_rows ? 0 : thread, plan.size);
      for (int64_t task = lo; task < hi; ++task) backward_task<scalar_t, W>(s, plan, g, task, w);
    });
  });
  Tensor dA_dn = A.size(1) == 1 ? dA.sum({0, 1}).unsqueeze(1) : dA.sum(0).t().contiguous();  // (d, 1) or (d, n)
  auto slot_sum = [&](const Tensor& x) { return own_rows ? x.select(0, 0) : x.sum(0); };
  return {du, ddelta, dA_dn, slot_sum(dB), slot_sum(dC), dD.sum(0), dz, dbias.sum(0), dh0};
}

}  // namespace

TORCH_LIBRARY(seqlab_scan, m) {
  m.def(
      "fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, "
      "Tensor? h0, bool softplus, int chunk) -> Tensor[]");
  m.def(
      "bwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, "
      "Tensor bounds, Tensor dy, Tensor? dh_last, bool softplus, int chunk) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(seqlab_scan, CPU, m) {
  m.impl("fwd", &scan_fwd);
  m.impl("bwd", &scan_bwd);
}
