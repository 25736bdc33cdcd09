// Vectorizable elementary functions for seqlab's CPU kernels: exp, log(1 + e) on [0, 1], softplus, sigmoid.
//
// Branch-free polynomials, inlined, so that `#pragma omp simd` loops that call them vectorize without
// -ffast-math (libm's exp is a call the vectorizer cannot widen). Accurate to a few ulps in float and double.

#pragma once

#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#define SEQLAB_VEC_INLINE inline __attribute__((always_inline))  // for the kernels' small vector helpers

namespace seqlab_vec {

// Subnormal floats (below 1.2e-38, or 2.2e-308 in double) cost x86 cores a microcode assist of tens to hundreds
// of cycles for each vector instruction that reads or makes one. Trained models make them: GELU's σ(2z) and
// softmax's exp of scores far below the row's maximum land there, and the products that consume them slow down
// 10-20x (benchmarks/bench_denormals.py). Every kernel task runs under this guard, which sets the thread's
// MXCSR to flush them to zero (FTZ: a result below the normal range is 0; DAZ: such an input reads as 0) and
// restores the thread's own setting when the task ends, so no caller's floating-point state changes. A value
// changes only where it was below 1.2e-38 in magnitude. Other CPUs: no effect.
class FlushDenormals {
#if defined(__SSE__)
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bits 15 (flush to zero) and 6 (denormals are zero)
  unsigned saved_;
#endif
};


template <typename T>
struct Num;
template <>
struct Num<float> {
  using U = uint32_t;
  static constexpr float lo = -87.33f, hi = 88.0f;  // exp's range: 2^round(x / ln 2) stays a normal float
  static constexpr float log2e = 1.44269504f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  static constexpr float round = 12582912.0f;  // 1.5·2^23: (x + round) - round rounds x to an integer
  static constexpr U round_bits = 0x4B400000u, bias = 127;
  static constexpr int mantissa = 23, exp_degree = 7, log_terms = 8;
};
template <>
struct Num<double> {
  using U = uint64_t;
  static constexpr double lo = -708.39, hi = 709.0;
  static constexpr double log2e = 1.4426950408889634, ln2_hi = 6.93145751953125e-1;
  static constexpr double ln2_lo = 1.42860682030941723212e-6, round = 6755399441055744.0;  // 1.5·2^52
  static constexpr U round_bits = 0x4338000000000000ull, bias = 1023;
  static constexpr int mantissa = 52, exp_degree = 13, log_terms = 17;
};

// exp's Taylor series by Horner, 1 + r(1 + r/2(1 + r/3(… (1 + r/N)))), unrolled at compile time so that the
// vector loops that call it stay free of inner loops
template <typename T, int K, int N>
inline T exp_series(T r) {
  if constexpr (K > N) {
    return T(1);
  } else {
    constexpr T inv = T(1) / T(K);
    return T(1) + r * inv * exp_series<T, K + 1, N>(r);
  }
}

// Σ_{k ≥ K} s2^(k - K) / (2k + 1), the series of atanh(s) / s in s2 = s², unrolled likewise
template <typename T, int K, int N>
inline T atanh_series(T s2) {
  constexpr T inv = T(1) / T(2 * K + 1);
  if constexpr (K + 1 >= N) {
    return inv;
  } else {
    return inv + s2 * atanh_series<T, K + 1, N>(s2);
  }
}

// exp(x) = 2^m · exp(r), m = round(x / ln 2), r = x - m ln 2 ∈ [-ln 2/2, ln 2/2]; exp(r) by its Taylor series
// (degree 7 in float, 13 in double: truncation below half an ulp); 2^m built in the exponent bits. x is
// clamped to the range where 2^m is a normal number (e^-87.3 ≈ 1e-38 stands for 0).
template <typename T>
inline T exp_(T x) {
  using K = Num<T>;
  x = x < K::lo ? K::lo : x;  // (not std::min/max: their by-reference constants defeat the vectorizer)
  x = x > K::hi ? K::hi : x;
  const T v = x * K::log2e + K::round;  // round's low mantissa bits now hold m
  const T m = v - K::round;
  const T r = (x - m * K::ln2_hi) - m * K::ln2_lo;
  const T p = exp_series<T, 1, K::exp_degree>(r);
  using U = typename K::U;
  const U bits = (__builtin_bit_cast(U, v) - K::round_bits + K::bias) << K::mantissa;  // the bits of 2^m
  return p * __builtin_bit_cast(T, bits);
}

// log(1 + e) for e ∈ [0, 1] = 2 atanh(s) = 2 Σ_k s^(2k+1) / (2k+1), s = e / (2 + e) ≤ 1/3
template <typename T>
inline T log1p_unit(T e) {
  const T s = e / (2 + e);
  return 2 * s * atanh_series<T, 0, Num<T>::log_terms>(s * s);
}

// softplus(x) = log(1 + e^x) = max(x, 0) + log(1 + e^-|x|). torch returns x itself past 20; this differs from
// that by log(1 + e^-x) < 2.1e-9 there, which is below float's resolution and what lets the loop vectorize.
template <typename T>
inline T softplus_(T x) {
  const T ax = x < 0 ? -x : x;
  return (x > 0 ? x : T(0)) + log1p_unit(exp_(-ax));
}

template <typename T>
inline T sigmoid_(T x) {
  return T(1) / (T(1) + exp_(-x));
}

// silu(x) = x σ(x)
template <typename T>
inline T silu_(T x) {
  return x * sigmoid_(x);
}

// GELU with the tanh approximation: ½ x (1 + tanh z) = x σ(2z), z = √(2/π) (x + 0.044715 x³). Below x = -30,
// σ(2z) is 0 in either type, but exp_'s clamp leaves it at e^-88 (float) or e^-709 (double), subnormal, which
// times x = -3e38 would be -1.8 where subnormals are not flushed: 0 there (a select, so the loops still vectorize).
template <typename T>
inline T gelu_tanh_(T x) {
  const T y = x * sigmoid_(T(2) * T(0.7978845608028654) * (x + T(0.044715) * x * x * x));
  return x < T(-30) ? x * T(0) : y;
}

#if defined(__AVX512F__)
// exp of 16 floats at once, for loops written with AVX-512 intrinsics: exp(x) = 2^m exp(r), m = round(x / ln 2),
// r = x - m ln 2, exp(r) by a degree-6 polynomial (Chebyshev-interpolated on [-ln 2/2, ln 2/2]: below 1 ulp in
// float), and 2^m applied by vscalefps, which also gives 0 and inf where the result leaves float's range. 13
// instructions where the generic exp_ compiles to about 25 (its clamps to a normal 2^m and the bits of 2^m).
// x is clamped to [-104, 89] first (beyond, r would lose its precision; the result is 0 or inf either way);
// max/min return their second operand for a NaN, so that a NaN stays NaN.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
  const __m512 round = _mm512_set1_ps(Num<float>::round);
  const __m512 m = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(Num<float>::log2e), round), round);
  __m512 r = _mm512_fnmadd_ps(m, _mm512_set1_ps(Num<float>::ln2_hi), x);
  r = _mm512_fnmadd_ps(m, _mm512_set1_ps(Num<float>::ln2_lo), r);
  __m512 p = _mm512_set1_ps(1.3941108481958508e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.37512593716383e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166635125875473e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666415333747864e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, m);
}

// exp16 of N vectors at once, each step applied to all N before the next: N independent chains side by side in
// the instruction stream. exp16's 13 steps form one dependent chain (~50 cycles); issued one after another, the
// out-of-order window holds too few of them to overlap, and the loops that call exp16 ran latency-bound.
template <int N>
SEQLAB_VEC_INLINE void exp16n(__m512 (&x)[N]) {
  const __m512 round = _mm512_set1_ps(Num<float>::round);
  __m512 m[N], r[N], p[N];
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q)
    x[q] = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x[q]));
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q)
    m[q] = _mm512_sub_ps(_mm512_fmadd_ps(x[q], _mm512_set1_ps(Num<float>::log2e), round), round);
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) r[q] = _mm512_fnmadd_ps(m[q], _mm512_set1_ps(Num<float>::ln2_hi), x[q]);
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) r[q] = _mm512_fnmadd_ps(m[q], _mm512_set1_ps(Num<float>::ln2_lo), r[q]);
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q)
    p[q] = _mm512_fmadd_ps(_mm512_set1_ps(1.3941108481958508e-3f), r[q], _mm512_set1_ps(8.37512593716383e-3f));
  const float c[5] = {4.166635125875473e-2f, 1.6666415333747864e-1f, 0.5f, 1.0f, 1.0f};
#pragma GCC unroll 8
  for (int j = 0; j < 5; ++j)
#pragma GCC unroll 8
    for (int q = 0; q < N; ++q) p[q] = _mm512_fmadd_ps(p[q], r[q], _mm512_set1_ps(c[j]));
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) x[q] = _mm512_scalef_ps(p[q], m[q]);
}

// 1 / d for d in [1, 1e38]: vrcp14ps (14 bits) and one Newton step, r (2 - d r) (28 bits), instead of a division
inline __m512 recip16(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

// σ(x) = 1 / (1 + e^-x); -x is clamped at 87 so that 1 + e^-x stays finite (σ < 1.7e-38 there)
inline __m512 sigmoid16(__m512 x) {
  const __m512 e = exp16(_mm512_min_ps(_mm512_set1_ps(87.0f), _mm512_sub_ps(_mm512_setzero_ps(), x)));
  return recip16(_mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// softplus as softplus_ does it: max(x, 0) + log(1 + e), e = e^-|x|, log(1 + e) = 2 atanh(s), s = e / (2 + e)
inline __m512 softplus16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __m512 s = _mm512_mul_ps(e, recip16(_mm512_add_ps(_mm512_set1_ps(2.0f), e))), s2 = _mm512_mul_ps(s, s);
  __m512 p = _mm512_set1_ps(1.0f / 15);  // Σ_k s2^k / (2k + 1), k < 8
  for (int k = 6; k >= 0; --k) p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(1.0f / float(2 * k + 1)));
  return _mm512_add_ps(_mm512_max_ps(_mm512_setzero_ps(), x), _mm512_mul_ps(_mm512_add_ps(s, s), p));
}

// softplus16 and sigmoid16 of N vectors at once, interleaved as exp16n
template <int N>
SEQLAB_VEC_INLINE void softplus16n(__m512 (&x)[N]) {
  __m512 e[N], s[N], s2[N], p[N];
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) e[q] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x[q]));
  exp16n<N>(e);
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) s[q] = _mm512_mul_ps(e[q], recip16(_mm512_add_ps(_mm512_set1_ps(2.0f), e[q])));
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) s2[q] = _mm512_mul_ps(s[q], s[q]), p[q] = _mm512_set1_ps(1.0f / 15);
#pragma GCC unroll 8
  for (int k = 6; k >= 0; --k)
#pragma GCC unroll 8
    for (int q = 0; q < N; ++q) p[q] = _mm512_fmadd_ps(p[q], s2[q], _mm512_set1_ps(1.0f / float(2 * k + 1)));
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q)
    x[q] = _mm512_add_ps(_mm512_max_ps(_mm512_setzero_ps(), x[q]), _mm512_mul_ps(_mm512_add_ps(s[q], s[q]), p[q]));
}

template <int N>
SEQLAB_VEC_INLINE void sigmoid16n(__m512 (&x)[N]) {
  __m512 e[N];
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) e[q] = _mm512_min_ps(_mm512_set1_ps(87.0f), _mm512_sub_ps(_mm512_setzero_ps(), x[q]));
  exp16n<N>(e);
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) x[q] = recip16(_mm512_add_ps(_mm512_set1_ps(1.0f), e[q]));
}
#endif

}  // namespace seqlab_vec
