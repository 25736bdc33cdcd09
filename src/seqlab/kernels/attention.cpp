// Scaled dot-product attention on the CPU for short sequences, forward and backward, one (batch, head) pair
// per task. Built on first use by seqlab/kernels/attention.py.
//
//   S = Q Kᵀ                     (t_q, t_k)        one block of query rows at a time, all keys at once
//   P = softmax(scale S + M)                       M = −∞ above the diagonal when causal
//   O = P V                      (t_q, d)          lse = log Σ_j exp(scale S_ij)  kept per row
//
// backward, from dO (Dao et al. 2022, arXiv 2205.14135, eqs. in their §B.2), P recomputed from S and lse:
//
//   Δ_i = Σ_d dO_id O_id      dP = dO Vᵀ      dS = P ⊙ (dP − Δ)
//   dQ = scale dS K           dK = scale dSᵀ Q      dV = Pᵀ dO
//
// Why a kernel: at the sequence lengths of a ViT (50-200 patches) or a small GPT (256), torch's CPU flash
// attention spends most of its time around its matrix products rather than in them. Here a whole row block
// of scores lives in one buffer (the softmax is exact, two passes over the row, no running rescale), and every
// product is C (+)= A B with A and B row-major, run by one register-blocked micro-kernel: 6 rows × 32 columns of
// C in 12 vector registers, a row of B loaded once per step and each A element broadcast from memory.
// Tensors are read and written through their strides (q, k, v may be views of one packed projection; the
// output is laid out (b, t, h, d) so that merging the heads is free, and the gradients are written where the caller
// says, e.g. into one packed (b, t, 3 h d) gradient); each (b, h) task owns its rows of dq, dk, dv, so there
// are no atomics and the results do not depend on the thread count. A head dim that is not a multiple of the
// vector width runs on zero-padded copies of the task's rows (forward_one, backward_one), and bfloat16 tensors
// on float32 copies of them.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

using seqlab_vec::exp_;

template <typename T>
struct Vec {
  static constexpr int W = 64 / sizeof(T);  // lanes in a 64-byte vector: 16 floats, 8 doubles
  typedef T V __attribute__((vector_size(64)));
};

template <typename T>
inline typename Vec<T>::V load(const T* p) {
  typename Vec<T>::V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
inline void store(T* p, typename Vec<T>::V v) {
  std::memcpy(p, &v, sizeof(v));
}

// C[R × S·W] (+)= A[R × K] B[K × S·W]; A's element (r, k) at A[r ar + k ak] (ak = 1: row-major A; ar = 1: A
// read transposed from a row-major Aᵀ), row strides ldb and ldc
template <typename T, int R, int S>
inline void micro(int64_t K, const T* __restrict__ A, int64_t ar, int64_t ak, const T* __restrict__ B,
                  int64_t ldb, T* __restrict__ C, int64_t ldc, bool accumulate) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  V acc[R][S];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) acc[r][s] = accumulate ? load(C + r * ldc + s * W) : V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[S];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) b[s] = load(B + k * ldb + s * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V a = A[r * ar + k * ak] - V{};  // a broadcast (x − 0 = x for every x, so GCC emits no add)
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) acc[r][s] += a * b[s];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) store(C + r * ldc + s * W, acc[r][s]);
}

template <typename T, int S>
inline void micro_rows(int rows, int64_t K, const T* A, int64_t ar, int64_t ak, const T* B, int64_t ldb, T* C,
                       int64_t ldc, bool accumulate) {
  switch (rows) {
    case 6: return micro<T, 6, S>(K, A, ar, ak, B, ldb, C, ldc, accumulate);
    case 5: return micro<T, 5, S>(K, A, ar, ak, B, ldb, C, ldc, accumulate);
    case 4: return micro<T, 4, S>(K, A, ar, ak, B, ldb, C, ldc, accumulate);
    case 3: return micro<T, 3, S>(K, A, ar, ak, B, ldb, C, ldc, accumulate);
    case 2: return micro<T, 2, S>(K, A, ar, ak, B, ldb, C, ldc, accumulate);
    default: return micro<T, 1, S>(K, A, ar, ak, B, ldb, C, ldc, accumulate);
  }
}

// C[M × N] (+)= op(A) B, op(A) = A (M × K, row stride lda) or, with a_transposed, Aᵀ for A (K × M, row stride
// lda); B (K × N, row stride ldb); N a multiple of the vector width
template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, bool a_transposed, const T* B, int64_t ldb,
          T* C, int64_t ldc, bool accumulate) {
  constexpr int W = Vec<T>::W;
  const int64_t ar = a_transposed ? 1 : lda, ak = a_transposed ? lda : 1;
  for (int64_t j = 0; j < N; j += 2 * W) {
    const bool two = j + 2 * W <= N;
    for (int64_t i = 0; i < M; i += 6) {
      const int rows = int(std::min<int64_t>(6, M - i));
      if (two)
        micro_rows<T, 2>(rows, K, A + i * ar, ar, ak, B + j, ldb, C + i * ldc + j, ldc, accumulate);
      else
        micro_rows<T, 1>(rows, K, A + i * ar, ar, ak, B + j, ldb, C + i * ldc + j, ldc, accumulate);
    }
  }
}

#if defined(__AVX512F__)
// dst[16 × 16] = src[16 × 16]ᵀ in registers: pairs of rows interleaved by 32-bit, then 64-bit elements (each
// 128-bit lane then holds one column of four rows), then the lanes gathered by two rounds of vshuff32x4
inline void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], a[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + j], lane L: column 4 L + j of rows i .. i + 3
    const __m512d a0 = _mm512_castps_pd(a[i]), a1 = _mm512_castps_pd(a[i + 1]);
    const __m512d a2 = _mm512_castps_pd(a[i + 2]), a3 = _mm512_castps_pd(a[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2)), r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3)), r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 c0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), c1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 d0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 d1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    _mm512_storeu_ps(dst + j * ldd, _mm512_shuffle_f32x4(c0, d0, 0x88));
    _mm512_storeu_ps(dst + (4 + j) * ldd, _mm512_shuffle_f32x4(c1, d1, 0x88));
    _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_shuffle_f32x4(c0, d0, 0xDD));
    _mm512_storeu_ps(dst + (12 + j) * ldd, _mm512_shuffle_f32x4(c1, d1, 0xDD));
  }
}
#endif

// dst[c × r] = src[r × c]ᵀ (src row stride lds, dst row stride ldd), in 16 × 16 tiles (float32 with AVX-512: in
// registers, transpose16; a scalar loop per element it was 13% of the backward's time)
template <typename T>
void transpose(int64_t r, int64_t c, const T* src, int64_t lds, T* dst, int64_t ldd) {
  constexpr int64_t kTile = 16;
  for (int64_t i0 = 0; i0 < r; i0 += kTile)
    for (int64_t j0 = 0; j0 < c; j0 += kTile) {
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>) {
        if (i0 + kTile <= r && j0 + kTile <= c) {
          transpose16(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
          continue;
        }
      }
#endif
      for (int64_t i = i0; i < std::min(r, i0 + kTile); ++i)
        for (int64_t j = j0; j < std::min(c, j0 + kTile); ++j) dst[j * ldd + i] = src[i * lds + j];
    }
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// K (t × d, row stride ld) as Kᵀ (d × t_pad, row stride ldt ≥ t_pad), the columns t ... t_pad − 1 zeroed
template <typename T>
void transpose_padded(int64_t t, int64_t d, const T* src, int64_t ld, T* dst, int64_t t_pad, int64_t ldt) {
  transpose(t, d, src, ld, dst, ldt);
  for (int64_t c = 0; c < d; ++c) std::fill(dst + c * ldt + t, dst + c * ldt + t_pad, T(0));
}

// asks the cache for rows [0, t) of d elements each, row stride ld: the next task's inputs are requested while
// this task computes (its rows lie far apart when q, k, v are views of one projection, and the first touch
// of each was a tenth of the backward's time)
template <typename T>
void prefetch_rows(const T* p, int64_t t, int64_t d, int64_t ld) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t c = 0; c < d; c += kLine) __builtin_prefetch(p + i * ld + c);
}

constexpr int64_t kRows = 24;  // query rows per block: 4 micro-kernel row groups

// A (b, h, t, d) tensor's data as strided rows: element (bi, hi, ti, di) at p[bi sb + hi sh + ti st + di]
template <typename T>
struct Rows {
  T* p;
  int64_t sb, sh, st;
  Rows(const at::Tensor& x) : p(x.data_ptr<T>()), sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)) {}
  T* at(int64_t bi, int64_t hi) const { return p + bi * sb + hi * sh; }
};

// the scores of query rows [i0, i0 + m) against keys [0, n): S (m × n_pad, row stride n_pad) = Q Kᵀ, computed
// from the keys transposed (zero columns past n); then P = exp(scale S − lse) in place, 0 where masked
// (causal: key j > query i; and the padding columns j ≥ n). forward: lse computed here and stored; backward:
// lse given. With inv_rows (the forward) the rows are left unnormalized, exp(scale S − max), and 1 / Σ_j stored
// per row: the caller scales the row's output instead (d products instead of n).
// (no-split-loops: GCC would otherwise split each loop at `valid` and run the tail as a scalar add chain)
template <typename T, bool Keyed>
__attribute__((optimize("no-split-loops"))) void probs_rows(int64_t m, int64_t n, int64_t n_pad, int64_t i0,
                                                             bool causal, T scale, T* s, T* lse_rows,
                                                             bool compute_lse, const bool* __restrict__ keep,
                                                             T* inv_rows) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < m; ++r) {
    T* __restrict__ row = s + r * n_pad;
    const int64_t valid = causal ? std::min(n, i0 + r + 1) : n;
    // every loop runs over the whole padded row (a multiple of the vector width: no remainder loops), the
    // columns past `valid` (and, Keyed, the masked keys) selected away
    if (compute_lse) {
      T mx = neg_inf;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < n_pad; ++j) {
        const bool in = j < valid && (!Keyed || keep[j]);
        const T x = in ? row[j] * scale : neg_inf;  // scaled first: a negative scale is a scale too
        mx = x > mx ? x : mx;
      }
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n_pad; ++j) {
        const bool in = j < valid && (!Keyed || keep[j]);
        const T e = in ? exp_(row[j] * scale - mx) : T(0);
        row[j] = e;
        sum += e;
      }
      if (sum == T(0)) {  // every key masked: a zero output (seqlab's law), and P = 0 in the backward
        lse_rows[r] = std::numeric_limits<T>::infinity();
        if (inv_rows != nullptr) inv_rows[r] = T(0);
        continue;  // the row is already all zeros
      }
      lse_rows[r] = mx + std::log(sum);
      const T inv = T(1) / sum;
      if (inv_rows != nullptr) {
        inv_rows[r] = inv;
        continue;
      }
#pragma omp simd
      for (int64_t j = 0; j < n_pad; ++j) row[j] *= inv;
    } else {
      const T lse = lse_rows[r];
#pragma omp simd
      for (int64_t j = 0; j < n_pad; ++j) {
        const bool in = j < valid && (!Keyed || keep[j]);
        row[j] = in ? exp_(row[j] * scale - lse) : T(0);
      }
    }
  }
}

// keep: null, or this batch row's (t_k) key mask, false = never attended to
template <typename T>
void scores_to_probs(int64_t m, int64_t n, int64_t n_pad, int64_t i0, bool causal, T scale, T* s, T* lse_rows,
                     bool compute_lse, const bool* keep, T* inv_rows = nullptr) {
  if (keep == nullptr)
    probs_rows<T, false>(m, n, n_pad, i0, causal, scale, s, lse_rows, compute_lse, nullptr, inv_rows);
  else
    probs_rows<T, true>(m, n, n_pad, i0, causal, scale, s, lse_rows, compute_lse, keep, inv_rows);
}

// One (b, h) pair's rows of a tensor: row i at p + i st
template <typename T>
struct Mat {
  T* p;
  int64_t st;
};

// ---- dropout on P -------------------------------------------------------------------------------------------
// Element (task, i, j) of P is kept when a hash of (seed, task, i, j) is at least p·2³², and then scaled by
// 1 / (1 − p): a counter-based draw, so that the backward regenerates the forward's mask instead of storing it.
// The hashes are splitmix64 (per row) and the murmur3 finalizer (per element, 32-bit, so that it vectorizes).
inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

struct Dropout {
  bool on = false;
  uint64_t seed = 0;
  uint32_t threshold = 0;  // keep when the element's hash >= threshold
  double keep_scale = 1.0;  // 1 / (1 − p)
  Dropout(double p, uint64_t seed_) : on(p > 0), seed(seed_) {
    TORCH_CHECK(p >= 0 && p < 1, "attention: dropout_p must be in [0, 1), got ", p);
    threshold = uint32_t(std::min(p * 4294967296.0, 4294967295.0));
    keep_scale = 1.0 / (1.0 - p);
  }
  uint64_t row_key(int64_t task, int64_t tq, int64_t i) const {
    return splitmix64(seed ^ splitmix64(uint64_t(task) * uint64_t(tq) + uint64_t(i)));
  }
};

// 1/(1 − p) or 0 for element j of the row whose key is rk
template <typename T>
inline T keep_factor(uint64_t rk, int64_t j, uint32_t threshold, T keep_scale) {
  const uint32_t h = fmix32(uint32_t(rk) ^ fmix32(uint32_t(j) + uint32_t(rk >> 32)));
  return h >= threshold ? keep_scale : T(0);
}

// P ⊙ mask / (1 − p) in place, for query rows [i0, i0 + m) of this task
template <typename T>
void drop_rows(T* s, int64_t m, int64_t np, int64_t i0, const Dropout& drop, int64_t task, int64_t tq) {
  const T ks = T(drop.keep_scale);
  for (int64_t r = 0; r < m; ++r) {
    T* __restrict__ row = s + r * np;
    const uint64_t rk = drop.row_key(task, tq, i0 + r);
#pragma omp simd
    for (int64_t j = 0; j < np; ++j) row[j] *= keep_factor<T>(rk, j, drop.threshold, ks);
  }
}

template <typename T>
void forward_task(Mat<const T> q, Mat<const T> k, Mat<const T> v, Mat<T> o, T* lse, const bool* keep, int64_t tq,
                  int64_t tk, int64_t d, bool causal, T scale, const Dropout& drop, int64_t task,
                  std::vector<T>& work) {
  constexpr int W = Vec<T>::W;
  const int64_t n_pad = round_up(tk, W), ldt = n_pad + W;  // ldt: Kᵀ's row stride, never a multiple of 4 KiB
  work.resize(d * ldt + kRows * n_pad + kRows);
  T* kt = work.data();
  T* s = kt + d * ldt;
  T* inv = s + kRows * n_pad;  // each row's 1 / Σ_j exp(scale S_ij − max)
  const T *qp = q.p, *kp = k.p, *vp = v.p;
  T* op = o.p;
  transpose_padded(tk, d, kp, k.st, kt, n_pad, ldt);
  for (int64_t i0 = 0; i0 < tq; i0 += kRows) {
    const int64_t m = std::min(kRows, tq - i0);
    const int64_t n = causal ? std::min(tk, i0 + m) : tk;  // keys any row of the block sees
    const int64_t np = round_up(n, W);
    gemm<T>(m, np, d, qp + i0 * q.st, q.st, false, kt, ldt, s, np, false);
    scores_to_probs<T>(m, n, np, i0, causal, scale, s, lse + i0, true, keep, inv);  // unnormalized
    if (drop.on) drop_rows(s, m, np, i0, drop, task, tq);
    gemm<T>(m, d, n, s, np, false, vp, v.st, op + i0 * o.st, o.st, false);
    for (int64_t r = 0; r < m; ++r) {  // O = P V with P's normalization applied to O's rows
      T* __restrict__ orow = op + (i0 + r) * o.st;
      const T f = inv[r];
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) orow[c] *= f;
    }
  }
}

template <typename T>
void backward_task(Mat<const T> q, Mat<const T> k, Mat<const T> v, Mat<const T> o, Mat<const T> g, const T* lse,
                   const bool* keep, Mat<T> dq, Mat<T> dk, Mat<T> dv, int64_t tq, int64_t tk, int64_t d, bool causal,
                   T scale, const Dropout& drop, int64_t task, std::vector<T>& work) {
  constexpr int W = Vec<T>::W;
  const int64_t n_pad = round_up(tk, W), ldt = n_pad + W;
  work.resize(2 * d * ldt + 2 * kRows * n_pad + kRows);
  T* kt = work.data();
  T* vt = kt + d * ldt;
  T* p = vt + d * ldt;        // P, (kRows × np)
  T* dp = p + kRows * n_pad;  // dP, then dS
  T* delta = dp + kRows * n_pad;
  const T *qp = q.p, *kp = k.p, *vp = v.p, *op = o.p, *gp = g.p;
  T *dqp = dq.p, *dkp = dk.p, *dvp = dv.p;
  transpose_padded(tk, d, kp, k.st, kt, n_pad, ldt);
  transpose_padded(tk, d, vp, v.st, vt, n_pad, ldt);
  // this task's rows of dk and dv: rows [0, seen) hold sums from earlier blocks; a block's first products into
  // rows [seen, n) write instead of adding (no zero fill beforehand)
  int64_t seen = 0;
  for (int64_t i0 = 0; i0 < tq; i0 += kRows) {
    const int64_t m = std::min(kRows, tq - i0);
    const int64_t n = causal ? std::min(tk, i0 + m) : tk;
    const int64_t np = round_up(n, W);
    const T* qi = qp + i0 * q.st;
    const T* gi = gp + i0 * g.st;
    for (int64_t r = 0; r < m; ++r) {
      const T* orow = op + (i0 + r) * o.st;
      const T* grow = gi + r * g.st;
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t c = 0; c < d; ++c) acc += orow[c] * grow[c];
      delta[r] = acc;
    }
    gemm<T>(m, np, d, qi, q.st, false, kt, ldt, p, np, false);  // S
    scores_to_probs<T>(m, n, np, i0, causal, scale, p, const_cast<T*>(lse + i0), false, keep);  // P
    gemm<T>(m, np, d, gi, g.st, false, vt, ldt, dp, np, false);  // dP = dO Vᵀ
    for (int64_t r = 0; r < m; ++r) {  // dS = scale P ⊙ (dP − Δ)
      T* __restrict__ prow = p + r * np;
      T* __restrict__ drow = dp + r * np;
      const T dl = delta[r];
      if (!drop.on) {
#pragma omp simd
        for (int64_t j = 0; j < np; ++j) drow[j] = scale * prow[j] * (drow[j] - dl);
        continue;
      }
      // with dropout, what came back is ∂L/∂P' for P' = P ⊙ mask / (1 − p): ∂L/∂P = it ⊙ mask / (1 − p), Δ is
      // unchanged (Σ_j P'_ij ∂L/∂P'_ij = Σ_c dO_ic O_ic), and dV takes P' (written over P)
      const uint64_t rk = drop.row_key(task, tq, i0 + r);
      const T ks = T(drop.keep_scale);
#pragma omp simd
      for (int64_t j = 0; j < np; ++j) {
        const T f = keep_factor<T>(rk, j, drop.threshold, ks), pj = prow[j];
        drow[j] = scale * pj * (drow[j] * f - dl);
        prow[j] = pj * f;
      }
    }
    gemm<T>(m, d, n, dp, np, false, kp, k.st, dqp + i0 * dq.st, dq.st, false);  // dQ = dS K
    // dV += Pᵀ dO and dK += dSᵀ Q, over the keys this block sees (P and dS read transposed in place)
    const int64_t old_rows = std::min(seen, n);
    if (old_rows > 0) {
      gemm<T>(old_rows, d, m, p, np, true, gi, g.st, dvp, dv.st, true);
      gemm<T>(old_rows, d, m, dp, np, true, qi, q.st, dkp, dk.st, true);
    }
    if (n > old_rows) {
      gemm<T>(n - old_rows, d, m, p + old_rows, np, true, gi, g.st, dvp + old_rows * dv.st, dv.st, false);
      gemm<T>(n - old_rows, d, m, dp + old_rows, np, true, qi, q.st, dkp + old_rows * dk.st, dk.st, false);
      seen = n;
    }
  }
  for (int64_t j = seen; j < tk; ++j) {  // keys no query saw (none when t_q = t_k): zero gradients
    std::fill(dkp + j * dk.st, dkp + j * dk.st + d, T(0));
    std::fill(dvp + j * dv.st, dvp + j * dv.st + d, T(0));
  }
}

// each thread's work buffers, kept between calls (a fresh one would be page-faulted in on every call): the
// task's own, and the padded copies of its rows when the head dim is not a multiple of the vector width
template <typename T, int Which = 0>
std::vector<T>& scratch() {
  thread_local std::vector<T> work;
  return work;
}

// A head dim d that is not a multiple of the vector width runs as d_pad = ⌈d / W⌉ W: each task copies its rows
// into zero-padded buffers (zero columns add nothing to q kᵀ, and the padded output columns are dropped), O(t d)
// copies beside O(t² d) products. Tensors stored in bfloat16 (torch.autocast's CPU dtype) take the same route:
// their rows are widened to float32 on the way in (exactly: a bf16 is a float's high half), and the outputs
// rounded to nearest-even on the way out; the rows' log-sum-exp stays float32.
template <typename S>
struct Compute {
  using T = S;  // float32 and float64 compute in their own type
};
template <>
struct Compute<at::BFloat16> {
  using T = float;
};

template <typename T, typename S>
Mat<const T> padded(Mat<const S> x, int64_t t, int64_t d, int64_t dp, T* dst) {
  for (int64_t i = 0; i < t; ++i) {
    std::transform(x.p + i * x.st, x.p + i * x.st + d, dst + i * dp, [](S e) { return static_cast<T>(e); });
    std::fill(dst + i * dp + d, dst + (i + 1) * dp, T(0));
  }
  return {dst, dp};
}

template <typename T, typename S>
void unpad(const T* src, int64_t t, int64_t d, int64_t dp, Mat<S> x) {
  for (int64_t i = 0; i < t; ++i)
    std::transform(src + i * dp, src + i * dp + d, x.p + i * x.st, [](T e) { return static_cast<S>(e); });
}

template <typename T>
Mat<const T> rows_of(const Rows<T>& x, int64_t task, int64_t h) {
  return {x.at(task / h, task % h), x.st};
}

template <typename T>
Mat<T> out_rows_of(const Rows<T>& x, int64_t task, int64_t h) {
  return {x.at(task / h, task % h), x.st};
}

// S: the tensors' storage type, T: the type computed in
template <typename S, typename T = typename Compute<S>::T>
void forward_one(int64_t task, int64_t h, const Rows<S>& q, const Rows<S>& k, const Rows<S>& v, const Rows<S>& o,
                 T* lse, const bool* keep, int64_t tq, int64_t tk, int64_t d, bool causal, T scale,
                 const Dropout& drop) {
  const int64_t dp = round_up(d, Vec<T>::W);
  if constexpr (std::is_same_v<S, T>) {
    if (dp == d) {
      forward_task<T>(rows_of(q, task, h), rows_of(k, task, h), rows_of(v, task, h), out_rows_of(o, task, h), lse,
                      keep, tq, tk, d, causal, scale, drop, task, scratch<T>());
      return;
    }
  }
  std::vector<T>& pad = scratch<T, 1>();
  pad.resize(2 * (tq + tk) * dp);
  T *qb = pad.data(), *kb = qb + tq * dp, *vb = kb + tk * dp, *ob = vb + tk * dp;
  forward_task<T>(padded(rows_of(q, task, h), tq, d, dp, qb), padded(rows_of(k, task, h), tk, d, dp, kb),
                  padded(rows_of(v, task, h), tk, d, dp, vb), Mat<T>{ob, dp}, lse, keep, tq, tk, dp, causal,
                  scale, drop, task, scratch<T>());
  unpad(ob, tq, d, dp, out_rows_of(o, task, h));
}

template <typename S, typename T = typename Compute<S>::T>
void backward_one(int64_t task, int64_t h, const Rows<S>& q, const Rows<S>& k, const Rows<S>& v, const Rows<S>& o,
                  const Rows<S>& g, const T* lse, const bool* keep, const Rows<S>& dq, const Rows<S>& dk,
                  const Rows<S>& dv, int64_t tq, int64_t tk, int64_t d, bool causal, T scale, const Dropout& drop) {
  const int64_t dp = round_up(d, Vec<T>::W);
  if constexpr (std::is_same_v<S, T>) {
    if (dp == d) {
      backward_task<T>(rows_of(q, task, h), rows_of(k, task, h), rows_of(v, task, h), rows_of(o, task, h),
                       rows_of(g, task, h), lse, keep, out_rows_of(dq, task, h), out_rows_of(dk, task, h),
                       out_rows_of(dv, task, h), tq, tk, d, causal, scale, drop, task, scratch<T>());
      return;
    }
  }
  std::vector<T>& pad = scratch<T, 1>();
  pad.resize((4 * tq + 4 * tk) * dp);
  T *qb = pad.data(), *ob = qb + tq * dp, *gb = ob + tq * dp, *dqb = gb + tq * dp;
  T *kb = dqb + tq * dp, *vb = kb + tk * dp, *dkb = vb + tk * dp, *dvb = dkb + tk * dp;
  backward_task<T>(padded(rows_of(q, task, h), tq, d, dp, qb), padded(rows_of(k, task, h), tk, d, dp, kb),
                   padded(rows_of(v, task, h), tk, d, dp, vb), padded(rows_of(o, task, h), tq, d, dp, ob),
                   padded(rows_of(g, task, h), tq, d, dp, gb), lse, keep, Mat<T>{dqb, dp}, Mat<T>{dkb, dp},
                   Mat<T>{dvb, dp}, tq, tk, dp, causal, scale, drop, task, scratch<T>());
  unpad(dqb, tq, d, dp, out_rows_of(dq, task, h));
  unpad(dkb, tk, d, dp, out_rows_of(dk, task, h));
  unpad(dvb, tk, d, dp, out_rows_of(dv, task, h));
}

bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

void check(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 4 && t.stride(3) == 1, "attention: ", name,
              " must be a (b, h, t, d) CPU tensor with a contiguous last dimension; got shape ", t.sizes(),
              ", strides ", t.strides(), " on ", t.device());
  const auto k = t.scalar_type();
  TORCH_CHECK(k == like.scalar_type() && (k == at::kFloat || k == at::kDouble || k == at::kBFloat16),
              "attention: ", name, " must be float32, float64 or bfloat16 like q; got ", k, " (q is ",
              like.scalar_type(), ")");
}

// an empty (b, h, t, d) tensor laid out as (b, t, h, d)
at::Tensor heads_last(const at::Tensor& like, int64_t b, int64_t h, int64_t t, int64_t d) {
  return at::empty({b, t, h, d}, like.options()).transpose(1, 2);
}

}  // namespace

// keep: none, or a contiguous (b, t_k) bool key mask (false = masked for every query of that batch row)
const bool* keep_rows(const std::optional<at::Tensor>& keep, int64_t b, int64_t tk) {
  if (!keep.has_value()) return nullptr;
  TORCH_CHECK(keep->scalar_type() == at::kBool && keep->is_contiguous() && keep->dim() == 2 &&
                  keep->size(0) == b && keep->size(1) == tk && keep->device().is_cpu(),
              "attention: keep must be a contiguous (b, t_k) = (", b, ", ", tk, ") bool CPU tensor; got ",
              keep->scalar_type(), " ", keep->sizes());
  return keep->data_ptr<bool>();
}

std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          bool causal, double scale, const std::optional<at::Tensor>& keep,
                                          double dropout_p, int64_t seed) {
  const Dropout drop(dropout_p, uint64_t(seed));
  check(q, "q", q);
  check(k, "k", q);
  check(v, "v", q);
  const int64_t b = q.size(0), h = q.size(1), tq = q.size(2), d = q.size(3), tk = k.size(2);
  const bool* kp = keep_rows(keep, b, tk);
  TORCH_CHECK(k.size(0) == b && v.size(0) == b && k.size(1) == h && v.size(1) == h && v.size(2) == tk &&
                  k.size(3) == d && v.size(3) == d,
              "attention: q (b, h, t_q, d), k and v (b, h, t_k, d) expected; got q ", q.sizes(), ", k ", k.sizes(),
              ", v ", v.sizes());
  TORCH_CHECK(d >= 1, "attention: the head dim must be at least 1");
  TORCH_CHECK(!causal || tq == tk, "attention: causal needs t_q == t_k; got t_q ", tq, ", t_k ", tk);
  at::Tensor o = heads_last(q, b, h, tq, d);
  at::Tensor lse = at::empty({b, h, tq}, q.options().dtype(is_bf16(q) ? at::kFloat : q.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "attention_forward", [&] {
    using acc_t = typename Compute<scalar_t>::T;
    const Rows<scalar_t> qr(q), kr(k), vr(v), orr(o);
    acc_t* lp = lse.data_ptr<acc_t>();
    at::parallel_for(0, b * h, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t t = lo; t < hi; ++t) {
        if (t + 1 < hi) {
          const int64_t bn = (t + 1) / h, hn = (t + 1) % h;
          prefetch_rows(qr.at(bn, hn), tq, d, qr.st);
          prefetch_rows(kr.at(bn, hn), tk, d, kr.st);
          prefetch_rows(vr.at(bn, hn), tk, d, vr.st);
        }
        forward_one<scalar_t>(t, h, qr, kr, vr, orr, lp + t * tq, kp ? kp + (t / h) * tk : nullptr, tq, tk, d,
                              causal, acc_t(scale), drop);
      }
    });
  });
  return {o, lse};
}

void attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& o, const at::Tensor& lse, bool causal, double scale, const at::Tensor& dq,
                        const at::Tensor& dk, const at::Tensor& dv, const std::optional<at::Tensor>& keep,
                        double dropout_p, int64_t seed) {
  const Dropout drop(dropout_p, uint64_t(seed));
  for (const auto& [t, name] : {std::pair{&grad, "grad"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"},
                                {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}})
    check(*t, name, q);
  const int64_t b = q.size(0), h = q.size(1), tq = q.size(2), d = q.size(3), tk = k.size(2);
  TORCH_CHECK(grad.sizes() == q.sizes() && o.sizes() == q.sizes() && dq.sizes() == q.sizes() &&
                  dk.sizes() == k.sizes() && dv.sizes() == v.sizes() && lse.is_contiguous() &&
                  lse.numel() == b * h * tq,
              "attention: grad, o and dq must be shaped like q, dk and dv like k and v, lse (b, h, t_q)");
  const bool* kp = keep_rows(keep, b, tk);
  TORCH_CHECK(lse.scalar_type() == (is_bf16(q) ? at::kFloat : q.scalar_type()),
              "attention: lse must be float32 for bfloat16 attention, else of q's dtype");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "attention_backward", [&] {
    using acc_t = typename Compute<scalar_t>::T;
    const Rows<scalar_t> qr(q), kr(k), vr(v), orr(o), gr(grad), dqr(dq), dkr(dk), dvr(dv);
    const acc_t* lp = lse.data_ptr<acc_t>();
    at::parallel_for(0, b * h, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t t = lo; t < hi; ++t) {
        if (t + 1 < hi) {
          const int64_t bn = (t + 1) / h, hn = (t + 1) % h;
          for (const auto* x : {&qr, &orr, &gr}) prefetch_rows(x->at(bn, hn), tq, d, x->st);
          for (const auto* x : {&kr, &vr}) prefetch_rows(x->at(bn, hn), tk, d, x->st);
        }
        backward_one<scalar_t>(t, h, qr, kr, vr, orr, gr, lp + t * tq, kp ? kp + (t / h) * tk : nullptr, dqr, dkr,
                               dvr, tq, tk, d, causal, acc_t(scale), drop);
      }
    });
  });
}

// The dropout factors (0 or 1 / (1 − p)) that forward and backward apply to P, (b, h, t_q, t_k): for tests and
// for the written-out double backward
at::Tensor dropout_mask(int64_t b, int64_t h, int64_t tq, int64_t tk, double dropout_p, int64_t seed,
                        const at::Tensor& like) {
  const Dropout drop(dropout_p, uint64_t(seed));
  at::Tensor mask = at::empty({b, h, tq, tk}, like.options());
  AT_DISPATCH_FLOATING_TYPES(like.scalar_type(), "attention_dropout_mask", [&] {
    scalar_t* mp = mask.data_ptr<scalar_t>();
    for (int64_t t = 0; t < b * h; ++t)
      for (int64_t i = 0; i < tq; ++i) {
        const uint64_t rk = drop.row_key(t, tq, i);
        for (int64_t j = 0; j < tk; ++j)
          mp[(t * tq + i) * tk + j] =
              drop.on ? keep_factor<scalar_t>(rk, j, drop.threshold, scalar_t(drop.keep_scale)) : scalar_t(1);
      }
  });
  return mask;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &attention_forward, "(out, lse) of softmax(scale q kᵀ [+ causal mask, key mask]) v",
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("causal"), pybind11::arg("scale"),
        pybind11::arg("keep") = pybind11::none(), pybind11::arg("dropout_p") = 0.0, pybind11::arg("seed") = 0);
  m.def("backward", &attention_backward, "dq, dk, dv (written into the three given) from dL/dout, q, k, v, out, lse",
        pybind11::arg("grad"), pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("o"),
        pybind11::arg("lse"), pybind11::arg("causal"), pybind11::arg("scale"), pybind11::arg("dq"),
        pybind11::arg("dk"), pybind11::arg("dv"), pybind11::arg("keep") = pybind11::none(),
        pybind11::arg("dropout_p") = 0.0, pybind11::arg("seed") = 0);
  m.def("dropout_mask", &dropout_mask, "the factors dropout applies to P, (b, h, t_q, t_k), of like's dtype");
}
