// Bahdanau's additive attention score, forward and backward, each one pass (additive_score.py). Built on first use.
//
// Notation: b batch, t queries per row (1 at one decoder step), s source positions, d the attention width.
// q (b, t, d) = W_q s_i, k (b, s, d) = W_k h_j + bias (projected once per source), v (d):
//
//   e[b, i, j] = Σ_c v_c tanh(q[b, i, c] + k[b, j, c])
//
// PyTorch writes q + k, then its tanh, as two (b, t, s, d) tensors, reads them back for the product with v, and
// keeps the tanh for the backward; here the sum and the tanh live in registers. The backward recomputes them
// (no (b, t, s, d) tensor is kept), with th = tanh(q + k) and g = de[b, i, j] v_c (1 - th²):
//
//   dq[b, i, c] = Σ_j g,   dk[b, j, c] = Σ_i g,   dv_c = Σ_{b, i, j} de[b, i, j] th
//
// float: tanh(u) = 2 σ(2u) - 1 with vec_math.h's exp16 and a Newton-refined reciprocal on AVX-512, else
// 1 - 2 / (1 + e^{2u}) with its generic exp_ (both vectorized; absolute error below 2.5e-7);
// double: the C library's tanh, so that float64 matches torch to rounding. Work is shared over the batch rows
// (the backward: each row's dq and dk are its own, dv is summed over the rows afterwards).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

template <typename T>
inline T tanh_v(T u) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f - 2.0f / (1.0f + seqlab_vec::exp_(2.0f * u));  // ±1 where e^{2u} leaves float's range
  } else {
    return std::tanh(u);
  }
}

// q (b, t, d), k (b, s, d), v (d): contiguous, one floating dtype, on the CPU
void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 1, "expected q (b, t, d), k (b, s, d) and v (d), got q ",
              q.sizes(), ", k ", k.sizes(), " and v ", v.sizes());
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && v.size(0) == q.size(2),
              "q (b, t, d), k (b, s, d) and v (d) must agree in b and d, got q ", q.sizes(), ", k ", k.sizes(),
              " and v ", v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "seqlab's additive-score kernel takes float32 or float64, got ", q.scalar_type());
  for (const at::Tensor* x : {&q, &k, &v}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == q.scalar_type() && x->is_contiguous(),
                "q, k and v must be contiguous CPU tensors of one dtype, got ", x->scalar_type(), " on ",
                x->device());
  }
}

// Σ_c v_c tanh(q_c + k_c) over one row's d values
template <typename T>
T score(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, int64_t D) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < D; ++c) acc += v[c] * tanh_v(q[c] + k[c]);
  return acc;
}

// One (query, key) pair's backward, de its score's gradient: dq and dv accumulate; dk is written by the row's
// first query (first_k: a fresh buffer, no zeroing pass over it) and accumulated by the others
template <typename T>
void score_backward(T de, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    T* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv, int64_t D, bool first_k) {
#pragma omp simd
  for (int64_t c = 0; c < D; ++c) {
    const T th = tanh_v(q[c] + k[c]);
    const T g = de * v[c] * (T(1) - th * th);
    dq[c] += g;
    dk[c] = first_k ? g : dk[c] + g;
    dv[c] += de * th;
  }
}

#if defined(__AVX512F__)
// float with AVX-512: 16 channels a vector, tanh(u) = 2 σ(2u) - 1 through vec_math.h's sigmoid16 (exp16 and a
// reciprocal refined by one Newton step, where the generic loop divides), the last vector masked
inline __m512 tanh16(__m512 u) {
  return _mm512_fmsub_ps(_mm512_set1_ps(2.0f), seqlab_vec::sigmoid16(_mm512_add_ps(u, u)), _mm512_set1_ps(1.0f));
}

inline __mmask16 tail(int64_t c, int64_t D) {
  return D - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (D - c)) - 1);
}

template <>
float score<float>(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 16) {
    const __mmask16 m = tail(c, D);
    const __m512 u = _mm512_add_ps(_mm512_maskz_loadu_ps(m, q + c), _mm512_maskz_loadu_ps(m, k + c));
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, v + c), tanh16(u), acc);  // masked lanes: v = 0
  }
  return _mm512_reduce_add_ps(acc);
}

template <>
void score_backward<float>(float de, const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, float* __restrict__ dq, float* __restrict__ dk,
                           float* __restrict__ dv, int64_t D, bool first_k) {
  const __m512 g = _mm512_set1_ps(de), one = _mm512_set1_ps(1.0f);
  for (int64_t c = 0; c < D; c += 16) {
    const __mmask16 m = tail(c, D);
    const __m512 th = tanh16(_mm512_add_ps(_mm512_maskz_loadu_ps(m, q + c), _mm512_maskz_loadu_ps(m, k + c)));
    const __m512 gu = _mm512_mul_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, v + c)), _mm512_fnmadd_ps(th, th, one));
    _mm512_mask_storeu_ps(dq + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dq + c), gu));
    _mm512_mask_storeu_ps(dk + c, m, first_k ? gu : _mm512_add_ps(_mm512_maskz_loadu_ps(m, dk + c), gu));
    _mm512_mask_storeu_ps(dv + c, m, _mm512_fmadd_ps(g, th, _mm512_maskz_loadu_ps(m, dv + c)));
  }
}
#endif

}  // namespace

// -> e (b, t, s)
at::Tensor additive_score_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check(q, k, v);
  const int64_t B = q.size(0), T = q.size(1), S = k.size(1), D = q.size(2);
  at::Tensor e = at::empty({B, T, S}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "additive_score_forward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    scalar_t* ep = e.data_ptr<scalar_t>();
    at::parallel_for(0, B * T, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t r = lo; r < hi; ++r) {  // r = b * T + i
        const scalar_t* qi = qp + r * D;
        const scalar_t* kb = kp + (r / T) * S * D;
        for (int64_t j = 0; j < S; ++j) ep[r * S + j] = score(qi, kb + j * D, vp, D);
      }
    });
  });
  return e;
}

// de (b, t, s) -> {dq (b, t, d), dk (b, s, d), dv (d)}
std::vector<at::Tensor> additive_score_backward(const at::Tensor& de, const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v) {
  check(q, k, v);
  const int64_t B = q.size(0), T = q.size(1), S = k.size(1), D = q.size(2);
  TORCH_CHECK(de.sizes() == at::IntArrayRef({B, T, S}) && de.scalar_type() == q.scalar_type() && de.is_contiguous(),
              "de must be contiguous (b, t, s) = (", B, ", ", T, ", ", S, ") of q's dtype, got ", de.sizes());
  // dq is zeroed (a (b, t, d) query tensor: small beside k), dk written by each row's first query
  at::Tensor dq = at::zeros_like(q), dk = at::empty_like(k), dv_rows = at::zeros({B, D}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "additive_score_backward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    const scalar_t* dep = de.data_ptr<scalar_t>();
    scalar_t *dqp = dq.data_ptr<scalar_t>(), *dkp = dk.data_ptr<scalar_t>(), *dvp = dv_rows.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;
      for (int64_t b = lo; b < hi; ++b) {
        scalar_t* dvb = dvp + b * D;
        for (int64_t i = 0; i < T; ++i) {
          const scalar_t* qi = qp + (b * T + i) * D;
          scalar_t* dqi = dqp + (b * T + i) * D;
          for (int64_t j = 0; j < S; ++j)
            score_backward(dep[(b * T + i) * S + j], qi, kp + (b * S + j) * D, vp, dqi, dkp + (b * S + j) * D, dvb, D,
                           i == 0);
        }
      }
    });
  });
  return {dq, dk, dv_rows.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &additive_score_forward, "e = v . tanh(q + k): q (b, t, d), k (b, s, d), v (d) -> (b, t, s)");
  m.def("backward", &additive_score_backward, "de (b, t, s) -> dq (b, t, d), dk (b, s, d), dv (d)");
}
