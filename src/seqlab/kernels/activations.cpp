// GELU, exact (x Φ(x), Hendrycks & Gimpel 2016; BERT's and ViT's "gelu") and with the tanh approximation
// (GPT-2's "gelu_new"), forward and backward, one vectorized pass each. Built on first use by
// seqlab/kernels/activations.py.
//
//   tanh:  z = c (x + a x³),  c = sqrt(2/π), a = 0.044715
//          gelu(x) = ½ x (1 + tanh z) = x σ(2z)                          since ½ (1 + tanh z) = σ(2z)
//          gelu'(x) = σ(2z) + x σ(2z) (1 − σ(2z)) · 2c (1 + 3a x²)
//   exact: gelu(x) = x Φ(x),  gelu'(x) = Φ(x) + x φ(x),  φ(x) = e^(−x²/2) / √(2π)
//          Φ(−|x|) = ½ erfc(|x|/√2) = ½ e^(−x²/2) erfcx(|x|/√2),  Φ(|x|) = 1 − Φ(−|x|)
//
// The exact form never computes 1 + erf(x/√2), whose cancellation for x < 0 costs torch's kernel most of its
// digits in the tail; float32 uses a rational approximation of erfcx(z) = e^(z²) erfc(z) on [0, 10] (P4/Q5,
// 6e-9 relative error in float64; scripts/fit_erfcx.py fits it), float64 the C library's erfc.
//
// The bias forms take the linear layer's product before its bias, u = p + b (rows × cols, b per column), and return
// gelu(u); their backward returns dL/du and the bias gradient Σ_rows dL/du in the same pass (accumulated in
// float64), so the layer's bias never takes a pass of its own over the (rows × cols) activations.
//
// σ and the exponentials come from the branch-free polynomials of vec_math.h, so the loops vectorize (torch's own
// CPU kernel for the tanh approximation runs about 5x slower than its exact GELU on the machines seqlab is
// measured on). Threads: at::parallel_for, torch's own pool.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

using seqlab_vec::exp_;
using seqlab_vec::gelu_tanh_;

constexpr int64_t kGrain = 16384;  // elements per task: below this a thread's start-up costs more than it saves

// The scalar forms (float64, and float where AVX-512 is missing): value and g · derivative
struct TanhScalar {
  template <typename T>
  static T value(T v) {
    return gelu_tanh_(v);
  }
  template <typename T>
  static T grad(T g, T v) {
    // past |v| = 30 σ(2z) is 0 or 1 to the type's precision and the derivative with it (x³ would overflow below)
    if (std::abs(v) > T(30)) return v > T(0) ? g : g * T(0);
    const T c = T(0.7978845608028654), a = T(0.044715);
    const T e = exp_(T(-2) * c * (v + a * v * v * v));
    const T s = T(1) / (T(1) + e), s_rest = e * s;  // σ(2z) and 1 − σ(2z) = σ(−2z), without cancellation
    return g * (s + v * s * s_rest * T(2) * c * (T(1) + T(3) * a * v * v));
  }
};

struct ErfScalar {
  template <typename T>
  static T cdf(T v) {
    return T(0.5) * std::erfc(-v * T(0.7071067811865476));  // Φ(v), no cancellation at either tail
  }
  template <typename T>
  static T value(T v) {
    return v * cdf(v);
  }
  template <typename T>
  static T grad(T g, T v) {
    return g * (cdf(v) + v * T(0.3989422804014327) * std::exp(T(-0.5) * v * v));
  }
};

#if defined(__AVX512F__)
// Float32 with AVX-512: 16 elements at a time through exp16 and a Newton-refined reciprocal (vec_math.h), the
// last partial vector under a mask. max/min keep a NaN (their second operand is the value).
// Each form in two parts: exp_arg(x), the argument of its one exp, and the constructor from x and that exp, so
// that the loops below take four vectors' exps at once (exp16n: one exp is a dependent chain of ~13 instructions,
// and one vector after another the out-of-order window overlapped too few of them; the same bits, and on (8192,
// 160) with a bias, AMD EPYC: forward 1.07-1.19x, backward 1.16-1.23x).
struct Tanh16 {
  __m512 s, rest, slope;  // σ(2z), 1 - σ(2z), 2c (1 + 3a x²), at x clamped to [-30, 30] (beyond: x or 0)
  // e^-2z at the clamp of exp_arg (e^87 = 6.1e37; e^86.9 = 5.5e37): there σ(2z) < 1.7e-38, taken as 0, so that
  // x σ(2z) is 0 for every finite x below about -10.4 (1.7e-38 times x = -3e38 would be -5)
  static constexpr float kSaturated = 5.5e37f;
  static __m512 clamped(__m512 x) {
    return _mm512_min_ps(_mm512_set1_ps(30.0f), _mm512_max_ps(_mm512_set1_ps(-30.0f), x));
  }
  // e^-2z's argument, -2z clamped at 87, so that 1 + e stays finite (σ(2z) < 1.7e-38 there)
  static __m512 exp_arg(__m512 x) {
    x = clamped(x);
    const __m512 c2 = _mm512_set1_ps(2 * 0.7978845608028654f), a = _mm512_set1_ps(0.044715f);
    const __m512 poly = _mm512_fmadd_ps(a, _mm512_mul_ps(x, x), _mm512_set1_ps(1.0f));
    const __m512 two_z = _mm512_mul_ps(_mm512_mul_ps(c2, x), poly);
    return _mm512_min_ps(_mm512_set1_ps(87.0f), _mm512_sub_ps(_mm512_setzero_ps(), two_z));
  }
  Tanh16() = default;
  explicit Tanh16(__m512 x) : Tanh16(x, seqlab_vec::exp16(exp_arg(x))) {}
  Tanh16(__m512 x, __m512 e) {
    const __m512 c2 = _mm512_set1_ps(2 * 0.7978845608028654f);
    x = clamped(x);
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __mmask16 saturated = _mm512_cmp_ps_mask(e, _mm512_set1_ps(kSaturated), _CMP_GE_OQ);
    s = _mm512_mask_mov_ps(seqlab_vec::recip16(_mm512_add_ps(_mm512_set1_ps(1.0f), e)), saturated,
                           _mm512_setzero_ps());
    rest = _mm512_mask_mov_ps(_mm512_mul_ps(e, s), saturated, _mm512_set1_ps(1.0f));
    slope = _mm512_mul_ps(c2, _mm512_fmadd_ps(_mm512_set1_ps(3 * 0.044715f), x2, _mm512_set1_ps(1.0f)));
  }
  __m512 value(__m512 x) const { return _mm512_mul_ps(x, s); }
  __m512 deriv(__m512 x) const { return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(x, s), rest), slope, s); }
};

struct Erf16 {
  __m512 cdf, x_pdf;  // Φ(x) and x φ(x)
  static __m512 exp_arg(__m512 x) { return _mm512_mul_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(-0.5f)); }
  Erf16() = default;
  explicit Erf16(__m512 x) : Erf16(x, seqlab_vec::exp16(exp_arg(x))) {}
  Erf16(__m512 x, __m512 e) {  // e = e^(-x²/2)
    const __m512 ax = _mm512_abs_ps(x);
    const __m512 z = _mm512_min_ps(_mm512_set1_ps(10.0f), _mm512_mul_ps(ax, _mm512_set1_ps(0.70710678f)));
    __m512 p = _mm512_set1_ps(0.032733220143984748f);  // erfcx(z) ≈ P(z) / Q(z)
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.22890625430348488f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.73093446137881479f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.237754695477006f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.0000000051220226f));
    __m512 q = _mm512_set1_ps(0.05801740796654762f);
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(0.40575259260231689f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.324120830253894f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(2.4008220324619312f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(2.3661344256765968f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.0f));
    const __m512 tail = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), e),
                                      _mm512_mul_ps(p, seqlab_vec::recip16(q)));  // Φ(-|x|)
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    cdf = _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), tail), negative, tail);
    x_pdf = _mm512_mul_ps(x, _mm512_mul_ps(e, _mm512_set1_ps(0.3989422804014327f)));
  }
  __m512 value(__m512 x) const { return _mm512_mul_ps(x, cdf); }
  __m512 deriv(__m512) const { return _mm512_add_ps(cdf, x_pdf); }
};

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// 16 values of the storage type in, as float32; and out. bfloat16 (torch.autocast's CPU dtype) is widened exactly
// (its bits are the high half of the float's) and rounded back to nearest-even as c10::BFloat16 rounds (a NaN
// becomes 0x7FC0, torch's quiet NaN), so a stored bf16 result is the bf16 rounding of the float32 one.
inline __m512 load16(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }

inline __m512 load16(__mmask16 m, const at::BFloat16* p) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void store16(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }

inline void store16(at::BFloat16* p, __mmask16 m, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r));
}

// Four full vectors at a time: their exps interleaved, then each form from its exp
template <typename F>
SEQLAB_VEC_INLINE void four(const __m512 (&v)[4], F (&f)[4]) {
  __m512 e[4];
  for (int q = 0; q < 4; ++q) e[q] = F::exp_arg(v[q]);
  seqlab_vec::exp16n<4>(e);
  for (int q = 0; q < 4; ++q) f[q] = F(v[q], e[q]);
}

// the same on four full vectors read at x
template <typename F, typename S>
SEQLAB_VEC_INLINE void four(const S* x, __m512 (&v)[4], F (&f)[4]) {
  for (int q = 0; q < 4; ++q) v[q] = load16(__mmask16(0xFFFF), x + 16 * q);
  four(v, f);
}

// the same on four full vectors p + b (a row's pre-activations and their bias)
template <typename F>
SEQLAB_VEC_INLINE void four(const float* p, const float* b, __m512 (&v)[4], F (&f)[4]) {
  for (int q = 0; q < 4; ++q) v[q] = _mm512_add_ps(_mm512_loadu_ps(p + 16 * q), _mm512_loadu_ps(b + 16 * q));
  four(v, f);
}

template <typename F, typename S>
void forward(const S* __restrict__ x, S* __restrict__ y, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 64 <= hi; i += 64) {
    __m512 v[4];
    F f[4];
    four(x + i, v, f);
    for (int q = 0; q < 4; ++q) store16(y + i + 16 * q, __mmask16(0xFFFF), f[q].value(v[q]));
  }
  for (; i < hi; i += 16) {
    const __mmask16 m = tail_mask(hi - i);
    const __m512 v = load16(m, x + i);
    store16(y + i, m, F(v).value(v));
  }
}

template <typename F, typename S>
void backward(const S* __restrict__ g, const S* __restrict__ x, S* __restrict__ dx, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 64 <= hi; i += 64) {
    __m512 v[4];
    F f[4];
    four(x + i, v, f);
    for (int q = 0; q < 4; ++q)
      store16(dx + i + 16 * q, __mmask16(0xFFFF),
              _mm512_mul_ps(load16(__mmask16(0xFFFF), g + i + 16 * q), f[q].deriv(v[q])));
  }
  for (; i < hi; i += 16) {
    const __mmask16 m = tail_mask(hi - i);
    const __m512 v = load16(m, x + i);
    store16(dx + i, m, _mm512_mul_ps(load16(m, g + i), F(v).deriv(v)));
  }
}

// rows [r0, r1) of p (rows × cols) + b: y = gelu(p + b)
template <typename F>
void bias_forward_rows(const float* __restrict__ p, const float* __restrict__ b, float* __restrict__ y, int64_t cols,
                       int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    int64_t j = 0;
    for (; j + 64 <= cols; j += 64) {
      __m512 v[4];
      F f[4];
      four(p + r * cols + j, b + j, v, f);
      for (int q = 0; q < 4; ++q) _mm512_storeu_ps(y + r * cols + j + 16 * q, f[q].value(v[q]));
    }
    for (; j < cols; j += 16) {
      const __mmask16 m = tail_mask(cols - j);
      const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p + r * cols + j), _mm512_maskz_loadu_ps(m, b + j));
      _mm512_mask_storeu_ps(y + r * cols + j, m, F(v).value(v));
    }
  }
}

// one vector of du = g · gelu'(u) stored (mask m), and added into its columns' float64 sums db
SEQLAB_VEC_INLINE void bias_grad_store(__m512 out, __mmask16 m, float* du, double* db) {
  _mm512_mask_storeu_ps(du, m, out);
  const __mmask8 m_lo = __mmask8(m & 0xFF), m_hi = __mmask8(m >> 8);
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(out));
  _mm512_mask_storeu_pd(db, m_lo, _mm512_add_pd(_mm512_maskz_loadu_pd(m_lo, db), lo));
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(out), 1));
  _mm512_mask_storeu_pd(db + 8, m_hi, _mm512_add_pd(_mm512_maskz_loadu_pd(m_hi, db + 8), _mm512_cvtps_pd(hi)));
}

// rows [r0, r1): du = g · gelu'(p + b), and Σ_rows du added into db (cols float64s)
template <typename F>
void bias_backward_rows(const float* __restrict__ g, const float* __restrict__ p, const float* __restrict__ b,
                        float* __restrict__ du, double* __restrict__ db, int64_t cols, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    int64_t j = 0;
    for (; j + 64 <= cols; j += 64) {
      __m512 v[4];
      F f[4];
      const int64_t i = r * cols + j;
      four(p + i, b + j, v, f);
      for (int q = 0; q < 4; ++q)
        bias_grad_store(_mm512_mul_ps(_mm512_loadu_ps(g + i + 16 * q), f[q].deriv(v[q])), __mmask16(0xFFFF),
                        du + i + 16 * q, db + j + 16 * q);
    }
    for (; j < cols; j += 16) {
      const __mmask16 m = tail_mask(cols - j);
      const int64_t i = r * cols + j;
      const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p + i), _mm512_maskz_loadu_ps(m, b + j));
      const __m512 out = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + i), F(v).deriv(v));  // 0 past the tail
      bias_grad_store(out, m, du + i, db + j);
    }
  }
}

// the vector form of each scalar form
template <typename F>
struct Vector;
template <>
struct Vector<TanhScalar> {
  using type = Tanh16;
};
template <>
struct Vector<ErfScalar> {
  using type = Erf16;
};

template <typename T>
constexpr bool kVector = std::is_same_v<T, float> || std::is_same_v<T, at::BFloat16>;  // the storage types above
#else
template <typename F>
struct Vector;  // none: every type takes the scalar loops

template <typename T>
constexpr bool kVector = false;

// declared only, so that the discarded vector branches below parse as C++17 (never instantiated here)
template <typename F, typename S>
void forward(const S* x, S* y, int64_t lo, int64_t hi);
template <typename F, typename S>
void backward(const S* g, const S* x, S* dx, int64_t lo, int64_t hi);
template <typename F>
void bias_forward_rows(const float* p, const float* b, float* y, int64_t cols, int64_t r0, int64_t r1);
template <typename F>
void bias_backward_rows(const float* g, const float* p, const float* b, float* du, double* db, int64_t cols,
                        int64_t r0, int64_t r1);
#endif

// Each form over a range, in the storage type S: the AVX-512 loops for float32 and bfloat16 where built, else
// scalar (bfloat16 widened to float and rounded once on the way out).
template <typename F, typename S>
void forward_range(const S* __restrict__ x, S* __restrict__ y, int64_t lo, int64_t hi) {
  if constexpr (kVector<S>) {
    forward<typename Vector<F>::type>(x, y, lo, hi);
  } else {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = S(F::value(static_cast<at::opmath_type<S>>(x[i])));
  }
}

template <typename F, typename S>
void backward_range(const S* __restrict__ g, const S* __restrict__ x, S* __restrict__ dx, int64_t lo, int64_t hi) {
  if constexpr (kVector<S>) {
    backward<typename Vector<F>::type>(g, x, dx, lo, hi);
  } else {
    using T = at::opmath_type<S>;
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) dx[i] = S(F::grad(static_cast<T>(g[i]), static_cast<T>(x[i])));
  }
}

template <typename F, typename T>
void bias_forward_range(const T* p, const T* b, T* y, int64_t cols, int64_t r0, int64_t r1) {
  if constexpr (kVector<T>) {
    bias_forward_rows<typename Vector<F>::type>(p, b, y, cols, r0, r1);
  } else {
    for (int64_t r = r0; r < r1; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = F::value(p[r * cols + j] + b[j]);
    }
  }
}

template <typename F, typename T>
void bias_backward_range(const T* g, const T* p, const T* b, T* du, double* db, int64_t cols, int64_t r0, int64_t r1) {
  if constexpr (kVector<T>) {
    bias_backward_rows<typename Vector<F>::type>(g, p, b, du, db, cols, r0, r1);
  } else {
    for (int64_t r = r0; r < r1; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const T d = F::grad(g[r * cols + j], p[r * cols + j] + b[j]);
        du[r * cols + j] = d;
        db[j] += static_cast<double>(d);
      }
    }
  }
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "gelu: ", name, " must be a contiguous CPU tensor");
  const auto k = t.scalar_type();
  TORCH_CHECK(k == at::kFloat || k == at::kDouble || k == at::kBFloat16, "gelu: ", name,
              " must be float32, float64 or bfloat16, got ", k);
}

// p (rows, cols) and b (cols,), float32 or float64, contiguous, same dtype
void check_bias(const at::Tensor& p, const at::Tensor& b) {
  check(p, "p");
  check(b, "b");
  TORCH_CHECK(p.scalar_type() != at::kBFloat16 && p.scalar_type() == b.scalar_type(),
              "gelu bias: p and b must both be float32 or both float64");
  TORCH_CHECK(p.dim() == 2 && b.dim() == 1 && b.size(0) == p.size(1), "gelu bias: expected p (rows, cols) and b (cols,)");
}

template <typename F>
at::Tensor gelu_forward(const at::Tensor& x) {
  check(x, "x");
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "gelu_forward", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      forward_range<F>(xp, yp, lo, hi);
    });
  });
  return y;
}

template <typename F>
at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x) {
  check(x, "x");
  check(grad, "grad");
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type(),
              "gelu: grad and x must share shape and dtype");
  at::Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "gelu_backward", [&] {
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      backward_range<F>(gp, xp, dp, lo, hi);
    });
  });
  return dx;
}

template <typename F>
at::Tensor gelu_bias_forward(const at::Tensor& p, const at::Tensor& b) {
  check_bias(p, b);
  at::Tensor y = at::empty_like(p);
  const int64_t rows = p.size(0), cols = p.size(1);
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "gelu_bias_forward", [&] {
    const scalar_t *pp = p.data_ptr<scalar_t>(), *bp = b.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      bias_forward_range<F>(pp, bp, yp, cols, r0, r1);
    });
  });
  return y;
}

// (dL/du, dL/db): the rows split into one block per thread, each block's column sums in its own float64 row,
// added in block order (the same result for the same thread count)
template <typename F>
std::vector<at::Tensor> gelu_bias_backward(const at::Tensor& grad, const at::Tensor& p, const at::Tensor& b) {
  check_bias(p, b);
  check(grad, "grad");
  TORCH_CHECK(grad.sizes() == p.sizes() && grad.scalar_type() == p.scalar_type(),
              "gelu bias: grad and p must share shape and dtype");
  const int64_t rows = p.size(0), cols = p.size(1);
  const int64_t min_rows = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows / min_rows));
  at::Tensor du = at::empty_like(p);
  at::Tensor partial = at::zeros({blocks, cols}, p.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "gelu_bias_backward", [&] {
    const scalar_t *gp = grad.data_ptr<scalar_t>(), *pp = p.data_ptr<scalar_t>(), *bp = b.data_ptr<scalar_t>();
    scalar_t* dp = du.data_ptr<scalar_t>();
    double* sums = partial.data_ptr<double>();
    at::parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t k = k0; k < k1; ++k)
        bias_backward_range<F>(gp, pp, bp, dp, sums + k * cols, cols, rows * k / blocks, rows * (k + 1) / blocks);
    });
  });
  return {du, partial.sum(0).to(p.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &gelu_forward<TanhScalar>, "gelu_tanh(x), x contiguous float32/float64/bfloat16 on the CPU");
  m.def("backward", &gelu_backward<TanhScalar>, "dL/dx of gelu_tanh given dL/dy and x");
  m.def("bias_forward", &gelu_bias_forward<TanhScalar>, "gelu_tanh(p + b), p (rows, cols) float32/float64, b (cols,)");
  m.def("bias_backward", &gelu_bias_backward<TanhScalar>, "(dL/du, dL/db) of gelu_tanh(u), u = p + b, given dL/dy");
  m.def("erf_forward", &gelu_forward<ErfScalar>, "gelu(x) = x Φ(x), x contiguous float32/float64/bfloat16 on the CPU");
  m.def("erf_backward", &gelu_backward<ErfScalar>, "dL/dx of gelu given dL/dy and x");
  m.def("erf_bias_forward", &gelu_bias_forward<ErfScalar>, "gelu(p + b), p (rows, cols) float32/float64, b (cols,)");
  m.def("erf_bias_backward", &gelu_bias_backward<ErfScalar>, "(dL/du, dL/db) of gelu(u), u = p + b, given dL/dy");
}
