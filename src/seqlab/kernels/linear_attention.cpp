// Causal linear attention as its recurrence, forward and backward, one (batch row, head) per unit of work. Built on
// first use by linear_attention.py.
//
// Notation: b batch, h heads, t time, k feature size, e value size. q, k are the features φ(q), φ(k) (b, h, t, k),
// v (b, h, t, e); each row (one position of one head) contiguous, rows at any stride. The state (S, z) is
// S (k, e), z (k) per head:
//
//   S_i = S_{i-1} + k_i v_iᵀ,   z_i = z_{i-1} + k_i,   n_i = S_iᵀ q_i,   d_i = q_iᵀ z_i + eps,   y_i = n_i / d_i
//
// per position O(k e) work and nothing of size t kept: on a CPU, at the head sizes of the lab, one sequential pass
// does less than the chunked parallel form's batched products (the layer's form for parallel hardware).
//
// Backward, with gy_i = dL/dy_i, gn_i = gy_i / d_i and gd_i = -(gy_i · y_i) / d_i:
//   dq_i = S_i gn_i + z_i gd_i                      (a forward sweep that rebuilds S_i and z_i)
//   G_i = G_{i+1} + q_i gn_iᵀ,  g_i = g_{i+1} + q_i gd_i,  starting from dL/dS_t and dL/dz_t (zero when unused)
//   dk_i = G_i v_i + g_i,   dv_i = G_iᵀ k_i,   dS_0 = G_1, dz_0 = g_1   (a reverse sweep)
// The forward's y is what the backward reads besides the inputs; d_i is rebuilt in the first sweep.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <optional>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "vec_math.h"

namespace {

// rows of one (batch row, head): position i at p + i * st, contiguous along the last dimension
template <typename T>
struct Rows {
  T* p;
  int64_t st;
  T* at(int64_t i) const { return p + i * st; }
};

template <typename T>
Rows<T> rows(const at::Tensor& x, int64_t bi, int64_t hi) {
  return {x.data_ptr<T>() + bi * x.stride(0) + hi * x.stride(1), x.stride(2)};
}

struct Shape {
  int64_t b, h, t, k, e;
};

// A unit's (rows, cols) state in a scratch whose rows are padded to a multiple of 16 values, 64-byte aligned,
// the padding zero
template <typename T>
struct Padded {
  int64_t rows, cols, ld;
  std::vector<T> storage;
  T* p;
  Padded(int64_t rows_, int64_t cols_) : rows(rows_), cols(cols_), ld((cols_ + 15) / 16 * 16) {
    storage.assign(rows * ld + 64 / sizeof(T), T(0));
    const auto addr = reinterpret_cast<uintptr_t>(storage.data());
    p = storage.data() + ((64 - addr % 64) % 64) / sizeof(T);
  }
  // from src (rows, cols), or from its transpose when src is (cols, rows)
  void load(const T* src, bool transposed) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) p[r * ld + c] = transposed ? src[c * rows + r] : src[r * cols + c];
  }
  void store(T* dst) const {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = p[r * ld + c];
  }
};

// S += a bᵀ, then out = Sᵀ x, in one pass over S's rows (each row used while in registers: reading back what was
// just stored would wait on the store)
template <typename T>
inline void update_and_read(T* __restrict__ S, int64_t ld, const T* __restrict__ a, const T* __restrict__ b,
                            const T* __restrict__ x, T* __restrict__ out, int64_t k, int64_t e) {
  for (int64_t c = 0; c < e; ++c) out[c] = T(0);
  for (int64_t r = 0; r < k; ++r) {
    const T ar = a[r], xr = x[r];
    T* Sr = S + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < e; ++c) {
      const T s = Sr[c] + ar * b[c];
      Sr[c] = s;
      out[c] += xr * s;
    }
  }
}

template <typename T>
inline T dot(const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  T s = T(0);
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

#if defined(__AVX512F__)
// float32 with AVX-512, for heads of up to 64 features: each row of a state as at most four 16-lane vectors. The
// state's rows are padded to whole, aligned vectors (Padded above): a masked store does not forward to the next
// step's load of the same row, which then waits for it (a step cost 270 ns at k = e = 18, 40 ns at 16).
constexpr int64_t kMaxWide = 64;

inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : left > 0 ? __mmask16((1u << left) - 1) : __mmask16(0);
}

inline void update_and_read(float* __restrict__ S, int64_t ld, const float* __restrict__ a,
                            const float* __restrict__ b, const float* __restrict__ x, float* __restrict__ out,
                            int64_t k, int64_t e) {
  if (e > kMaxWide || ld % 16 != 0) return update_and_read<float>(S, ld, a, b, x, out, k, e);
  const int64_t nv = (e + 15) / 16;
  __m512 bv[4], acc[4];
  __mmask16 m[4];
  for (int64_t v = 0; v < nv; ++v)
    m[v] = lanes(e - 16 * v), bv[v] = _mm512_maskz_loadu_ps(m[v], b + 16 * v), acc[v] = _mm512_setzero_ps();
  for (int64_t r = 0; r < k; ++r) {
    const __m512 ar = _mm512_set1_ps(a[r]), xr = _mm512_set1_ps(x[r]);
    float* Sr = S + r * ld;  // whole vectors: the padding lanes stay 0 (b's are), and stores forward to loads
    for (int64_t v = 0; v < nv; ++v) {
      const __m512 sv = _mm512_fmadd_ps(ar, bv[v], _mm512_load_ps(Sr + 16 * v));
      _mm512_store_ps(Sr + 16 * v, sv);
      acc[v] = _mm512_fmadd_ps(xr, sv, acc[v]);
    }
  }
  for (int64_t v = 0; v < nv; ++v) _mm512_mask_storeu_ps(out + 16 * v, m[v], acc[v]);
}

inline float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  if (n > kMaxWide) return dot<float>(a, b, n);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t v = 0; 16 * v < n; ++v) {
    const __mmask16 m = lanes(n - 16 * v);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + 16 * v), _mm512_maskz_loadu_ps(m, b + 16 * v), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
#endif

// One unit's forward: y rows, and the state after the last position in S, z (which hold the initial state).
template <typename T>
void forward_unit(Rows<T> q, Rows<T> k, Rows<T> v, Rows<T> y, T* S_out, T* z, const Shape& n, T eps, T* num,
                  Padded<T>& S) {
  S.load(S_out, false);
  for (int64_t i = 0; i < n.t; ++i) {
    const T *qi = q.at(i), *ki = k.at(i);
    update_and_read(S.p, S.ld, ki, v.at(i), qi, num, n.k, n.e);  // S_i = S_{i-1} + k_i v_iᵀ, n_i = S_iᵀ q_i
#pragma omp simd
    for (int64_t r = 0; r < n.k; ++r) z[r] += ki[r];
    const T inv = T(1) / (dot(qi, z, n.k) + eps);
    T* yi = y.at(i);
#pragma omp simd
    for (int64_t c = 0; c < n.e; ++c) yi[c] = num[c] * inv;
  }
  S.store(S_out);
}

// One unit's backward. S, z: the initial state on entry (overwritten); G, g: dL/dS_t, dL/dz_t on entry, dL/dS_0,
// dL/dz_0 on return. St, Gt (e, k) hold Sᵀ and Gᵀ, so that every product with a state is an axpy over rows,
// vectorized, rather than short dot products (a head's k and e are a few vectors wide at most); gn, gd: scratch of
// (t, e) and (t).
template <typename T>
void backward_unit(Rows<T> gy, Rows<T> q, Rows<T> k, Rows<T> v, Rows<T> y, Rows<T> dq, Rows<T> dk, Rows<T> dv,
                   const T* S, T* z, T* G_out, T* g, const Shape& n, T eps, Padded<T>& St, Padded<T>& G,
                   Padded<T>& Gt, T* gn, T* gd) {
  St.load(S, true), G.load(G_out, false), Gt.load(G_out, true);
  for (int64_t i = 0; i < n.t; ++i) {  // forward sweep: S_i, z_i, and dq_i = S_i gn_i + z_i gd_i
    const T *qi = q.at(i), *ki = k.at(i), *gyi = gy.at(i);
#pragma omp simd
    for (int64_t r = 0; r < n.k; ++r) z[r] += ki[r];
    const T inv = T(1) / (dot(qi, z, n.k) + eps);
    T* gni = gn + i * n.e;
#pragma omp simd
    for (int64_t c = 0; c < n.e; ++c) gni[c] = gyi[c] * inv;
    gd[i] = -dot(gyi, y.at(i), n.e) * inv;
    T* dqi = dq.at(i);
    update_and_read(St.p, St.ld, v.at(i), ki, gni, dqi, n.e, n.k);  // Sᵀ_i = Sᵀ_{i-1} + v_i k_iᵀ, S_i gn_i
#pragma omp simd
    for (int64_t r = 0; r < n.k; ++r) dqi[r] += z[r] * gd[i];
  }
  for (int64_t i = n.t - 1; i >= 0; --i) {  // reverse sweep: G_i, g_i, and dk_i = G_i v_i + g_i, dv_i = G_iᵀ k_i
    const T *qi = q.at(i), *ki = k.at(i), *vi = v.at(i), *gni = gn + i * n.e;
    T *dki = dk.at(i), *dvi = dv.at(i);
    update_and_read(G.p, G.ld, qi, gni, ki, dvi, n.k, n.e);   // G_i = G_{i+1} + q_i gn_iᵀ, dv_i = G_iᵀ k_i
    update_and_read(Gt.p, Gt.ld, gni, qi, vi, dki, n.e, n.k);  // Gᵀ_i likewise, G_i v_i
#pragma omp simd
    for (int64_t r = 0; r < n.k; ++r) {
      g[r] += qi[r] * gd[i];
      dki[r] += g[r];
    }
  }
  G.store(G_out);
}

#if defined(__AVX512F__)
// Heads with k, e <= R (R = 4, 8, 12, 16) in float32: the whole state stays in registers across the sequence, one
// 16-lane vector per row, so no step waits on a store of the step before (the padded-memory loops above take
// 100-150 ns a step at k = e = 18; these about a third of that at the lab's head sizes). The same arithmetic as
// forward_unit and backward_unit, in the same order within a row; partial sums are split in two.
inline __m512 masked(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

// update_and_read with the matrix in registers: X[r] += a[r] b for r < rows, and acc0 + Σ_r w[r] X[r] returned
// (the even rows summed into acc0, the odd into a second partial sum, then the two added)
template <int R>
SEQLAB_VEC_INLINE __m512 update_and_read_regs(__m512 (&X)[R], int64_t rows, const float* a, __m512 b,
                                              const float* w, __m512 acc0) {
  __m512 acc1 = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    X[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), b, X[r]);
    if (r % 2 == 0) acc0 = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), X[r], acc0);
    else acc1 = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), X[r], acc1);
  }
  return _mm512_add_ps(acc0, acc1);
}

template <int R>
void forward_regs(Rows<float> q, Rows<float> k, Rows<float> v, Rows<float> y, float* S_io, float* z_io,
                  const Shape& n, float eps) {
  const __mmask16 me = lanes(n.e), mk = lanes(n.k);
  __m512 S[R];
  for (int r = 0; r < R; ++r) S[r] = r < n.k ? masked(S_io + r * n.e, me) : _mm512_setzero_ps();
  __m512 zv = masked(z_io, mk);
  for (int64_t i = 0; i < n.t; ++i) {
    const float *qi = q.at(i), *ki = k.at(i);
    const __m512 vi = masked(v.at(i), me), kv = masked(ki, mk), qv = masked(qi, mk);
    const __m512 num = update_and_read_regs<R>(S, n.k, ki, vi, qi, _mm512_setzero_ps());  // S_i, S_iᵀ q_i
    zv = _mm512_add_ps(zv, kv);
    const float inv = 1.0f / (_mm512_reduce_add_ps(_mm512_mul_ps(qv, zv)) + eps);
    _mm512_mask_storeu_ps(y.at(i), me, _mm512_mul_ps(num, _mm512_set1_ps(inv)));
  }
  for (int r = 0; r < n.k; ++r) _mm512_mask_storeu_ps(S_io + r * n.e, me, S[r]);
  _mm512_mask_storeu_ps(z_io, mk, zv);
}

// rows[c] = column c of M (rows x cols, row-major), for c < cols: a transpose into registers
template <int R>
void columns(const float* M, int64_t rows, int64_t cols, __m512* out) {
  alignas(64) float col[16];
  for (int c = 0; c < R; ++c) {
    for (int r = 0; r < 16; ++r) col[r] = (c < cols && r < rows) ? M[r * cols + c] : 0.0f;
    out[c] = _mm512_load_ps(col);
  }
}

template <int R>
void backward_regs(Rows<float> gy, Rows<float> q, Rows<float> k, Rows<float> v, Rows<float> y, Rows<float> dq,
                   Rows<float> dk, Rows<float> dv, const float* S0, float* z_io, float* G_io, float* g_io,
                   const Shape& n, float eps, float* gn, float* gd) {
  const __mmask16 me = lanes(n.e), mk = lanes(n.k);
  __m512 St[R];
  columns<R>(S0, n.k, n.e, St);  // Sᵀ: row c is column c of S
  __m512 zv = masked(z_io, mk);
  for (int64_t i = 0; i < n.t; ++i) {  // forward sweep: dq_i = S_i gn_i + z_i gd_i
    const float* vi = v.at(i);
    const __m512 kv = masked(k.at(i), mk), qv = masked(q.at(i), mk), gyv = masked(gy.at(i), me);
    zv = _mm512_add_ps(zv, kv);
    const float inv = 1.0f / (_mm512_reduce_add_ps(_mm512_mul_ps(qv, zv)) + eps);
    const __m512 gnv = _mm512_mul_ps(gyv, _mm512_set1_ps(inv));
    float* gni = gn + i * n.e;
    _mm512_mask_storeu_ps(gni, me, gnv);
    gd[i] = -_mm512_reduce_add_ps(_mm512_mul_ps(gyv, masked(y.at(i), me))) * inv;
    const __m512 zgd = _mm512_mul_ps(zv, _mm512_set1_ps(gd[i]));
    _mm512_mask_storeu_ps(dq.at(i), mk, update_and_read_regs<R>(St, n.e, vi, kv, gni, zgd));  // Sᵀ_i, S_i gn_i
  }
  __m512 G[R], Gt[R];
  for (int r = 0; r < R; ++r) G[r] = r < n.k ? masked(G_io + r * n.e, me) : _mm512_setzero_ps();
  columns<R>(G_io, n.k, n.e, Gt);
  __m512 gv = masked(g_io, mk);
  for (int64_t i = n.t - 1; i >= 0; --i) {  // reverse sweep: dk_i = G_i v_i + g_i, dv_i = G_iᵀ k_i
    const float *qi = q.at(i), *ki = k.at(i), *vi = v.at(i), *gni = gn + i * n.e;
    const __m512 qv = masked(qi, mk), gnv = masked(gni, me);
    const __m512 dvi = update_and_read_regs<R>(G, n.k, qi, gnv, ki, _mm512_setzero_ps());  // G_i, G_iᵀ k_i
    gv = _mm512_fmadd_ps(qv, _mm512_set1_ps(gd[i]), gv);
    _mm512_mask_storeu_ps(dk.at(i), mk, update_and_read_regs<R>(Gt, n.e, gni, qv, vi, gv));  // Gᵀ_i, G_i v_i + g_i
    _mm512_mask_storeu_ps(dv.at(i), me, dvi);
  }
  for (int r = 0; r < n.k; ++r) _mm512_mask_storeu_ps(G_io + r * n.e, me, G[r]);
  _mm512_mask_storeu_ps(g_io, mk, gv);
}

// the register version's row count for this head (the widest of k and e, rounded up), 0 beyond 16
inline int register_rows(const Shape& n) {
  const int64_t w = std::max(n.k, n.e);
  return w <= 4 ? 4 : w <= 8 ? 8 : w <= 12 ? 12 : w <= 16 ? 16 : 0;
}

// forward_regs<R> or backward_regs<R> for this head's R; false where the generic loops must run
template <bool Backward, typename... A>
bool in_registers(const Shape& n, A&&... args) {
  switch (register_rows(n)) {
#define SEQLAB_LA_CASE(R)                                         \
  case R:                                                         \
    if constexpr (Backward) backward_regs<R>(args...);            \
    else forward_regs<R>(args...);                                \
    return true;
    SEQLAB_LA_CASE(4)
    SEQLAB_LA_CASE(8)
    SEQLAB_LA_CASE(12)
    SEQLAB_LA_CASE(16)
#undef SEQLAB_LA_CASE
    default:
      return false;
  }
}
#endif

Shape check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "linear_attention: CPU tensors");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "linear_attention: float32 or float64");
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
              "linear_attention: q, k must be (b, h, t, k) and v (b, h, t, e)");
  for (const auto* x : {&q, &k, &v})
    TORCH_CHECK(x->stride(3) == 1 && x->scalar_type() == q.scalar_type(),
                "linear_attention: q, k, v must share one dtype, each row contiguous");
  return {q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)};
}

// (b, h, k, e), (b, h, k): the carried state, or zeros
std::pair<at::Tensor, at::Tensor> state_or_zeros(const std::optional<at::Tensor>& S0,
                                                 const std::optional<at::Tensor>& z0, const Shape& n,
                                                 const at::TensorOptions& options) {
  TORCH_CHECK(S0.has_value() == z0.has_value(), "linear_attention: give both S and z, or neither");
  if (!S0.has_value()) return {at::zeros({n.b, n.h, n.k, n.e}, options), at::zeros({n.b, n.h, n.k}, options)};
  TORCH_CHECK(S0->sizes() == at::IntArrayRef({n.b, n.h, n.k, n.e}) && z0->sizes() == at::IntArrayRef({n.b, n.h, n.k}) &&
                  S0->scalar_type() == options.dtype().toScalarType() &&
                  z0->scalar_type() == options.dtype().toScalarType(),
              "linear_attention: the state must be S (b, h, k, e) and z (b, h, k) of q's dtype");
  return {S0->contiguous().clone(), z0->contiguous().clone()};
}

}  // namespace

// q, k (b, h, t, k), v (b, h, t, e), optional state (S, z) -> {y (b, t, h, e), S (b, h, k, e), z (b, h, k)}
std::vector<at::Tensor> linear_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const std::optional<at::Tensor>& S0,
                                                 const std::optional<at::Tensor>& z0, double eps) {
  const Shape n = check(q, k, v);
  auto [S, z] = state_or_zeros(S0, z0, n, q.options());
  at::Tensor y = at::empty({n.b, n.t, n.h, n.e}, q.options());  // the layout the output projection reads
  const at::Tensor yv = y.permute({0, 2, 1, 3});                  // (b, h, t, e)
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linear_attention_forward", [&] {
    at::parallel_for(0, n.b * n.h, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      std::vector<scalar_t> num(n.e);
      Padded<scalar_t> Sp(n.k, n.e);
      for (int64_t u = lo; u < hi; ++u) {
        const int64_t bi = u / n.h, h = u % n.h;
        scalar_t* Su = S.data_ptr<scalar_t>() + u * n.k * n.e;
        scalar_t* zu = z.data_ptr<scalar_t>() + u * n.k;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<scalar_t, float>) {
          if (in_registers<false>(n, rows<float>(q, bi, h), rows<float>(k, bi, h), rows<float>(v, bi, h),
                                  rows<float>(yv, bi, h), Su, zu, n, static_cast<float>(eps)))
            continue;
        }
#endif
        forward_unit(rows<scalar_t>(q, bi, h), rows<scalar_t>(k, bi, h), rows<scalar_t>(v, bi, h),
                     rows<scalar_t>(yv, bi, h), Su, zu, n, static_cast<scalar_t>(eps), num.data(), Sp);
      }
    });
  });
  return {y, S, z};
}

// -> {dq, dk (b, t, h, k), dv (b, t, h, e), dS0 (b, h, k, e), dz0 (b, h, k)}, given gy = dL/dy (b, h, t, e), the
// forward's y, and dL/dS, dL/dz of the returned state (None: unused)
std::vector<at::Tensor> linear_attention_backward(const at::Tensor& gy, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& y,
                                                  const std::optional<at::Tensor>& S0,
                                                  const std::optional<at::Tensor>& z0,
                                                  const std::optional<at::Tensor>& gS,
                                                  const std::optional<at::Tensor>& gz, double eps) {
  const Shape n = check(q, k, v);
  for (const auto* x : {&gy, &y})
    TORCH_CHECK(x->sizes() == v.sizes() && x->stride(3) == 1 && x->scalar_type() == q.scalar_type(),
                "linear_attention: gy and y must be (b, h, t, e) like v, each row contiguous");
  auto [S, z] = state_or_zeros(S0, z0, n, q.options());
  auto [G, g] = state_or_zeros(gS, gz, n, q.options());  // becomes dL/dS_0, dL/dz_0
  at::Tensor dq = at::empty({n.b, n.t, n.h, n.k}, q.options()), dk = at::empty_like(dq);
  at::Tensor dv = at::empty({n.b, n.t, n.h, n.e}, q.options());
  const at::Tensor dqv = dq.permute({0, 2, 1, 3}), dkv = dk.permute({0, 2, 1, 3}), dvv = dv.permute({0, 2, 1, 3});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linear_attention_backward", [&] {
    at::parallel_for(0, n.b * n.h, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      std::vector<scalar_t> gn(n.t * n.e), gd(n.t);
      Padded<scalar_t> St(n.e, n.k), Gp(n.k, n.e), Gt(n.e, n.k);
      for (int64_t u = lo; u < hi; ++u) {
        const int64_t bi = u / n.h, h = u % n.h;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<scalar_t, float>) {
          if (in_registers<true>(n, rows<float>(gy, bi, h), rows<float>(q, bi, h), rows<float>(k, bi, h),
                                 rows<float>(v, bi, h), rows<float>(y, bi, h), rows<float>(dqv, bi, h),
                                 rows<float>(dkv, bi, h), rows<float>(dvv, bi, h),
                                 S.data_ptr<float>() + u * n.k * n.e, z.data_ptr<float>() + u * n.k,
                                 G.data_ptr<float>() + u * n.k * n.e, g.data_ptr<float>() + u * n.k, n,
                                 static_cast<float>(eps), gn.data(), gd.data()))
            continue;
        }
#endif
        backward_unit(rows<scalar_t>(gy, bi, h), rows<scalar_t>(q, bi, h), rows<scalar_t>(k, bi, h),
                      rows<scalar_t>(v, bi, h), rows<scalar_t>(y, bi, h), rows<scalar_t>(dqv, bi, h),
                      rows<scalar_t>(dkv, bi, h), rows<scalar_t>(dvv, bi, h),
                      S.data_ptr<scalar_t>() + u * n.k * n.e, z.data_ptr<scalar_t>() + u * n.k,
                      G.data_ptr<scalar_t>() + u * n.k * n.e, g.data_ptr<scalar_t>() + u * n.k, n,
                      static_cast<scalar_t>(eps), St, Gp, Gt, gn.data(), gd.data());
      }
    });
  });
  return {dq, dk, dv, G, g};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &linear_attention_forward, "causal linear attention's recurrence -> y (b, t, h, e), S, z");
  m.def("backward", &linear_attention_backward, "-> dq, dk, dv (b, t, h, .), dS0, dz0");
}
