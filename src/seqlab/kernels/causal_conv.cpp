// Mamba's short causal depthwise convolution and the SiLU after it, forward and backward, on the (b, t, c) layout
// the block's projections produce (no transposes, no padded copy). Built on first use by causal_conv.py.
//
// Notation: b batch, t time, c channels, k the kernel width (Mamba's d_conv, 4). The k − 1 inputs before the
// sequence come from the carried conv state s (b, k − 1, c), oldest first (zeros for a fresh sequence):
//
//   in[τ]   = x[τ] for τ ≥ 0, s[k − 1 + τ] for −(k − 1) ≤ τ < 0
//   pre[t]  = bias + Σ_{j<k} w[j] ⊙ in[t − (k − 1) + j]                 w (k, c): tap j reads k − 1 − j steps back
//   y[t]    = silu(pre[t]) = pre σ(pre)
//
// Backward, with g = dL/dy: dpre = g (σ + pre σ (1 − σ)); dbias = Σ dpre; dw[j] = Σ dpre[t] ⊙ in[t − (k − 1) + j];
// din[τ] = Σ_j dpre[τ + (k − 1) − j] ⊙ w[j], split into dx (τ ≥ 0) and ds (τ < 0). pre is recomputed, not saved.
//
// Work is split over (batch row, segment of kSegment output rows) units, each covering every channel: a thread writes
// only its own rows of y and dx, so no cache line of them is shared between threads (a row of c floats is rarely a
// whole number of 64-byte lines, so splitting by channels made the threads write the same lines). The backward
// writes each input row's gradient once, as a gather over the k rows of dpre that read it: a unit computes dpre
// for its rows and the k - 1 past its end (a halo) into a buffer, and accumulates dw, dbias only over its own rows,
// into per-thread sums added up at the end. The SiLU and its derivative run over a unit's rows as one contiguous
// span (silu_span, dsilu_span).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "vec_math.h"

namespace {

using seqlab_vec::exp_;
using seqlab_vec::silu_;

constexpr int64_t kBlock = 16;  // channels per unit of work: one 64-byte line of floats; a thread takes its
                                // units as one contiguous channel range, so the vector loops run its whole width

struct Shape {
  int64_t b, t, c, k;
  int64_t ldx;  // x's row stride: c when contiguous, 2c for the x half of Mamba's (b, t, 2c) in_proj output
};

constexpr int64_t kSegment = 64;  // output rows per unit of work (of one batch row)

// in[bi, τ, :] for τ in [−(k − 1), t): a pointer to the row
template <typename T>
inline const T* row(const T* x, const T* s, const Shape& n, int64_t bi, int64_t tau) {
  return tau >= 0 ? x + (bi * n.t + tau) * n.ldx : s + (bi * (n.k - 1) + (n.k - 1 + tau)) * n.c;
}

// pre = bias + Σ_j w[j] ⊙ in[t − (k − 1) + j] at (bi, t), every channel
template <typename T>
inline void conv_at(const T* x, const T* s, const T* w, const T* bias, const Shape& n, int64_t bi, int64_t t, T* pre) {
  // Mamba's d_conv, 4: the four taps in one pass over the channels, each sum in a register until it is stored. Tap
  // by tap, every sum was loaded and stored again for each tap; in one pass the conv's forward ran 1.17-1.30x and,
  // with the input gradient's four taps likewise (backward_rows), its backward 1.17-1.28x faster at the lab's
  // b 8, t 1024, c 104 (one and two threads); the lab's Mamba LM step 1.01x.
  if (n.k == 4) {
    const T *__restrict__ i0 = row(x, s, n, bi, t - 3), *__restrict__ i1 = row(x, s, n, bi, t - 2);
    const T *__restrict__ i2 = row(x, s, n, bi, t - 1), *__restrict__ i3 = row(x, s, n, bi, t);
    const T* __restrict__ wp = w;
    T* __restrict__ out = pre;
#pragma omp simd
    for (int64_t c = 0; c < n.c; ++c)
      out[c] = (bias ? bias[c] : T(0)) + wp[c] * i0[c] + wp[n.c + c] * i1[c] + wp[2 * n.c + c] * i2[c] +
               wp[3 * n.c + c] * i3[c];
    return;
  }
  for (int64_t c = 0; c < n.c; ++c) pre[c] = bias ? bias[c] : T(0);
  for (int64_t j = 0; j < n.k; ++j) {
    const T* in = row(x, s, n, bi, t - (n.k - 1) + j);
    const T* wj = w + j * n.c;
#pragma omp simd
    for (int64_t c = 0; c < n.c; ++c) pre[c] += wj[c] * in[c];
  }
}

// The elementwise halves over `count` contiguous values: y = silu(pre) in place, and dpre = g (σ + pre σ (1 − σ)).
// With AVX-512 and floats, four vectors at a time through exp16n (vec_math.h): one value's exp is a chain of ~13
// dependent steps, and one vector after another the out-of-order window overlapped too few of them; a row-by-row
// loop over c channels also left every row's last partial vector to a scalar tail.
template <typename T>
void silu_span(T* v, int64_t count) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 64 <= count; i += 64) {
      __m512 p[4], e[4];
      for (int q = 0; q < 4; ++q) p[q] = _mm512_loadu_ps(v + i + 16 * q), e[q] = p[q];
      seqlab_vec::sigmoid16n<4>(e);
      for (int q = 0; q < 4; ++q) _mm512_storeu_ps(v + i + 16 * q, _mm512_mul_ps(p[q], e[q]));
    }
  }
#endif
#pragma omp simd
  for (int64_t j = i; j < count; ++j) v[j] = silu_(v[j]);
}

template <typename T>
void dsilu_span(const T* g, const T* pre, int64_t count, T* dpre) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 64 <= count; i += 64) {
      __m512 p[4], e[4];
      for (int q = 0; q < 4; ++q) p[q] = _mm512_loadu_ps(pre + i + 16 * q), e[q] = _mm512_sub_ps(_mm512_setzero_ps(), p[q]);
      seqlab_vec::exp16n<4>(e);
      for (int q = 0; q < 4; ++q) {  // σ = 1 / (1 + e), σ(1 − σ) = σ · e σ
        const __m512 sig = seqlab_vec::recip16(_mm512_add_ps(_mm512_set1_ps(1.0f), e[q]));
        const __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(p[q], sig), _mm512_mul_ps(e[q], sig), sig);
        _mm512_storeu_ps(dpre + i + 16 * q, _mm512_mul_ps(_mm512_loadu_ps(g + i + 16 * q), d));
      }
    }
  }
#endif
#pragma omp simd
  for (int64_t j = i; j < count; ++j) {
    const T p = pre[j], e = exp_(-p);
    const T sig = T(1) / (T(1) + e);
    dpre[j] = g[j] * (sig + p * sig * (e * sig));  // σ(1 − σ) = σ · e σ, without cancellation
  }
}

// y rows [t0, t1) of batch row bi: the convolutions into y's rows, then the SiLU over them as one span
template <typename T>
void forward_rows(const T* x, const T* s, const T* w, const T* bias, T* y, const Shape& n, int64_t bi, int64_t t0,
                  int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) conv_at(x, s, w, bias, n, bi, t, y + (bi * n.t + t) * n.c);
  silu_span(y + (bi * n.t + t0) * n.c, (t1 - t0) * n.c);
}

// dpre rows t in [t0, t1) of batch row bi into D (row t at D + (t − t0) c), zero outside [0, n.t); pre is
// recomputed into P (same layout), not saved
template <typename T>
void dpre_rows(const T* g, const T* x, const T* s, const T* w, const T* bias, const Shape& n, int64_t bi, int64_t t0,
               int64_t t1, T* P, T* D) {
  const int64_t lo = std::max<int64_t>(t0, 0), hi = std::min(t1, n.t);
  std::fill(D, D + (t1 - t0) * n.c, T(0));
  for (int64_t t = lo; t < hi; ++t) conv_at(x, s, w, bias, n, bi, t, P + (t - t0) * n.c);
  if (hi > lo) dsilu_span(g + (bi * n.t + lo) * n.c, P + (lo - t0) * n.c, (hi - lo) * n.c, D + (lo - t0) * n.c);
}

// The input-gradient rows τ in [τ0, τ1) of batch row bi (τ < 0: the state's rows), each written once:
// din[τ] = Σ_j dpre[τ + (k − 1) − j] ⊙ w[j], from the dpre rows [τ0, τ1 + k − 1) (D, zero outside [0, n.t)). dw and
// db gather the unit's own dpre rows t in [max(τ0, 0), τ1).
template <typename T>
void backward_rows(const T* g, const T* x, const T* s, const T* w, const T* bias, T* dx, T* ds, T* dw, T* db,
                   const Shape& n, int64_t bi, int64_t tau0, int64_t tau1, T* P, T* D) {
  dpre_rows(g, x, s, w, bias, n, bi, tau0, tau1 + n.k - 1, P, D);
  for (int64_t t = std::max<int64_t>(tau0, 0); t < std::min(tau1, n.t); ++t) {  // the unit's own rows: dw, db
    const T* dpre = D + (t - tau0) * n.c;
#pragma omp simd
    for (int64_t c = 0; c < n.c; ++c) db[c] += dpre[c];
    for (int64_t j = 0; j < n.k; ++j) {
      const T* in = row(x, s, n, bi, t - (n.k - 1) + j);
      T* dwj = dw + j * n.c;
#pragma omp simd
      for (int64_t c = 0; c < n.c; ++c) dwj[c] += dpre[c] * in[c];
    }
  }
  for (int64_t tau = tau0; tau < tau1; ++tau) {
    T* din = tau >= 0 ? dx + (bi * n.t + tau) * n.c : ds + (bi * (n.k - 1) + (n.k - 1 + tau)) * n.c;
    if (n.k == 4) {  // as conv_at: the four taps in one pass
      const T* __restrict__ d0 = D + (tau + 3 - tau0) * n.c;  // dpre[τ + 3 − j] = d0 − j c
      const T* __restrict__ wp = w;
      T* __restrict__ out = din;
#pragma omp simd
      for (int64_t c = 0; c < n.c; ++c)
        out[c] = d0[c] * wp[c] + d0[c - n.c] * wp[n.c + c] + d0[c - 2 * n.c] * wp[2 * n.c + c] +
                 d0[c - 3 * n.c] * wp[3 * n.c + c];
      continue;
    }
    for (int64_t c = 0; c < n.c; ++c) din[c] = T(0);
    for (int64_t j = 0; j < n.k; ++j) {
      const T* dp = D + (tau + (n.k - 1) - j - tau0) * n.c;  // dpre[τ + (k − 1) − j]
      const T* wj = w + j * n.c;
#pragma omp simd
      for (int64_t c = 0; c < n.c; ++c) din[c] += dp[c] * wj[c];
    }
  }
}

Shape check(const at::Tensor& x, const at::Tensor& s, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1 && x.stride(1) >= x.size(2) &&
                  x.stride(0) == x.size(1) * x.stride(1),
              "causal_conv: x must be (b, t, c) with contiguous channels and evenly spaced rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, "causal_conv: float32 or float64");
  const Shape n{x.size(0), x.size(1), x.size(2), w.size(0), x.stride(1)};
  TORCH_CHECK(w.dim() == 2 && w.size(1) == n.c && w.is_contiguous(), "causal_conv: w must be contiguous (k, c)");
  TORCH_CHECK(s.dim() == 3 && s.size(0) == n.b && s.size(1) == n.k - 1 && s.size(2) == n.c && s.is_contiguous(),
              "causal_conv: the state must be contiguous (b, k - 1, c)");
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == n.c && bias->is_contiguous() &&
                                     bias->scalar_type() == x.scalar_type()),
              "causal_conv: the bias must be a contiguous (c,) tensor of x's dtype");
  for (const auto* t : {&s, &w})
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "causal_conv: x, state and w must share one dtype");
  return n;
}

int64_t segments(const Shape& n, int64_t rows) { return (rows + kSegment - 1) / kSegment; }

}  // namespace

// x (b, t, c), state (b, k - 1, c), w (k, c), bias (c,) or None -> silu(causal depthwise conv) (b, t, c)
at::Tensor causal_conv_silu_forward(const at::Tensor& x, const at::Tensor& state, const at::Tensor& w,
                                    const std::optional<at::Tensor>& bias) {
  const Shape n = check(x, state, w, bias);
  at::Tensor y = at::empty({n.b, n.t, n.c}, x.options());
  const int64_t per_row = segments(n, n.t);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_conv_silu_forward", [&] {
    const scalar_t* bp = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n.b * per_row, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t bi = unit / per_row, t0 = (unit % per_row) * kSegment;
        forward_rows(x.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), bp,
                     y.data_ptr<scalar_t>(), n, bi, t0, std::min(n.t, t0 + kSegment));
      }
    });
  });
  return y;
}

// -> {dx (b, t, c), dstate (b, k - 1, c), dw (k, c), dbias (c,)}
std::vector<at::Tensor> causal_conv_silu_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& state,
                                                  const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  const Shape n = check(x, state, w, bias);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous(), "causal_conv: grad must be contiguous (b, t, c)");
  at::Tensor dx = at::empty(x.sizes(), x.options()), ds = at::empty_like(state);
  const int64_t rows = n.t + n.k - 1, per_row = segments(n, rows), threads = at::get_num_threads();
  at::Tensor parts = at::zeros({threads, n.k + 1, n.c}, x.options());  // per thread: dw (k, c), then dbias (c)
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_conv_silu_backward", [&] {
    const scalar_t* bp = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n.b * per_row, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      std::vector<scalar_t> pre((kSegment + n.k - 1) * n.c), dpre((kSegment + n.k - 1) * n.c);
      scalar_t* dw = parts.data_ptr<scalar_t>() + at::get_thread_num() * (n.k + 1) * n.c;
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t bi = unit / per_row, tau0 = (unit % per_row) * kSegment - (n.k - 1);
        backward_rows(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(),
                      w.data_ptr<scalar_t>(), bp, dx.data_ptr<scalar_t>(), ds.data_ptr<scalar_t>(), dw,
                      dw + n.k * n.c, n, bi, tau0, std::min(n.t, tau0 + kSegment), pre.data(), dpre.data());
      }
    });
  });
  at::Tensor sums = parts.sum(0);  // (k + 1, c)
  return {dx, ds, sums.narrow(0, 0, n.k).contiguous(), sums[n.k].contiguous()};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &causal_conv_silu_forward, "silu(causal depthwise conv1d) on (b, t, c)");
  m.def("backward", &causal_conv_silu_backward, "-> dx, dstate, dw, dbias");
}
