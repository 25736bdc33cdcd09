// LayerNorm over the last dimension (Ba et al. 2016), forward and backward, one pass over each row. Built on first
// use by seqlab/kernels/layer_norm.py.
//
// For a row x of n values, weight w, bias b:
//   μ = mean(x),  r = 1 / sqrt(mean((x − μ)²) + eps),  x̂ = (x − μ) r,  y = x̂ ⊙ w + b
// Backward, with g = dL/dy and ĝ = g ⊙ w:
//   dx = r (ĝ − mean(ĝ) − x̂ mean(ĝ ⊙ x̂)),   dw = Σ_rows g ⊙ x̂,   db = Σ_rows g
//
// Why: torch's CPU LayerNorm backward spends about 150 ns per row of 60 floats (a Mamba LM at the lab's width
// spent 4% of its training step there). Here rows are split over torch's threads, each thread adds its rows'
// weight and bias gradients into a buffer of its own (summed at the end), and rows go four at a time.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "vec_math.h"

namespace {

constexpr int64_t kGrain = 16384;  // values per task: below this a thread's start-up costs more than it saves

int64_t grain_rows(int64_t n) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)); }

// Rows go four at a time: each row's mean, variance and sums are a chain of dependent reductions, and four
// independent chains in the same loops keep the vector units busy (one row at a time ran 2-3x slower).
template <typename T>
void forward_four(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  T* __restrict__ mean, T* __restrict__ rstd, int64_t n, double eps, int64_t r) {
  const T *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
  T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) s0 += x0[i], s1 += x1[i], s2 += x2[i], s3 += x3[i];
  const T m0 = s0 / T(n), m1 = s1 / T(n), m2 = s2 / T(n), m3 = s3 / T(n);
  T q0 = 0, q1 = 0, q2 = 0, q3 = 0;
#pragma omp simd reduction(+ : q0, q1, q2, q3)
  for (int64_t i = 0; i < n; ++i) {
    q0 += (x0[i] - m0) * (x0[i] - m0), q1 += (x1[i] - m1) * (x1[i] - m1);
    q2 += (x2[i] - m2) * (x2[i] - m2), q3 += (x3[i] - m3) * (x3[i] - m3);
  }
  const T r0 = T(1) / std::sqrt(q0 / T(n) + T(eps)), r1 = T(1) / std::sqrt(q1 / T(n) + T(eps));
  const T r2 = T(1) / std::sqrt(q2 / T(n) + T(eps)), r3 = T(1) / std::sqrt(q3 / T(n) + T(eps));
  T *y0 = y + r * n, *y1 = y0 + n, *y2 = y1 + n, *y3 = y2 + n;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T bi = b ? b[i] : T(0);
    y0[i] = (x0[i] - m0) * r0 * w[i] + bi, y1[i] = (x1[i] - m1) * r1 * w[i] + bi;
    y2[i] = (x2[i] - m2) * r2 * w[i] + bi, y3[i] = (x3[i] - m3) * r3 * w[i] + bi;
  }
  mean[r] = m0, mean[r + 1] = m1, mean[r + 2] = m2, mean[r + 3] = m3;
  rstd[r] = r0, rstd[r + 1] = r1, rstd[r + 2] = r2, rstd[r + 3] = r3;
}

template <typename T>
void forward_one(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                 T* __restrict__ mean, T* __restrict__ rstd, int64_t n, double eps, int64_t r) {
  const T* xr = x + r * n;
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += xr[i];
  const T mu = s / T(n);
  T q = 0;
#pragma omp simd reduction(+ : q)
  for (int64_t i = 0; i < n; ++i) q += (xr[i] - mu) * (xr[i] - mu);
  const T rs = T(1) / std::sqrt(q / T(n) + T(eps));
  T* yr = y + r * n;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mu) * rs * w[i] + (b ? b[i] : T(0));
  mean[r] = mu, rstd[r] = rs;
}

template <typename T>
void forward_rows(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t n, double eps, int64_t lo,
                  int64_t hi) {
  int64_t r = lo;
  for (; r + 4 <= hi; r += 4) forward_four(x, w, b, y, mean, rstd, n, eps, r);
  for (; r < hi; ++r) forward_one(x, w, b, y, mean, rstd, n, eps, r);
}

// Σ ĝ and Σ ĝ x̂ of row r (ĝ = g ⊙ w), and the row's share of dw and db
template <typename T>
void backward_one(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                  const T* __restrict__ mean, const T* __restrict__ rstd, T* __restrict__ dx, T* __restrict__ dw,
                  T* __restrict__ db, int64_t n, int64_t r) {
  const T *gr = g + r * n, *xr = x + r * n;
  const T mu = mean[r], rs = rstd[r];
  T s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
  for (int64_t i = 0; i < n; ++i) {
    const T xh = (xr[i] - mu) * rs, gh = gr[i] * w[i];
    s1 += gh, s2 += gh * xh;
    dw[i] += gr[i] * xh, db[i] += gr[i];
  }
  const T a = s1 / T(n), c = s2 / T(n);
  T* dxr = dx + r * n;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dxr[i] = rs * (gr[i] * w[i] - a - (xr[i] - mu) * rs * c);
}

template <typename T>
void backward_four(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                   const T* __restrict__ mean, const T* __restrict__ rstd, T* __restrict__ dx, T* __restrict__ dw,
                   T* __restrict__ db, int64_t n, int64_t r) {
  const T *g0 = g + r * n, *g1 = g0 + n, *g2 = g1 + n, *g3 = g2 + n;
  const T *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
  const T m0 = mean[r], m1 = mean[r + 1], m2 = mean[r + 2], m3 = mean[r + 3];
  const T r0 = rstd[r], r1 = rstd[r + 1], r2 = rstd[r + 2], r3 = rstd[r + 3];
  T a0 = 0, a1 = 0, a2 = 0, a3 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, c0, c1, c2, c3)
  for (int64_t i = 0; i < n; ++i) {
    const T h0 = (x0[i] - m0) * r0, h1 = (x1[i] - m1) * r1, h2 = (x2[i] - m2) * r2, h3 = (x3[i] - m3) * r3;
    a0 += g0[i] * w[i], a1 += g1[i] * w[i], a2 += g2[i] * w[i], a3 += g3[i] * w[i];
    c0 += g0[i] * w[i] * h0, c1 += g1[i] * w[i] * h1, c2 += g2[i] * w[i] * h2, c3 += g3[i] * w[i] * h3;
    dw[i] += g0[i] * h0 + g1[i] * h1 + g2[i] * h2 + g3[i] * h3;
    db[i] += g0[i] + g1[i] + g2[i] + g3[i];
  }
  a0 /= T(n), a1 /= T(n), a2 /= T(n), a3 /= T(n), c0 /= T(n), c1 /= T(n), c2 /= T(n), c3 /= T(n);
  T *d0 = dx + r * n, *d1 = d0 + n, *d2 = d1 + n, *d3 = d2 + n;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    d0[i] = r0 * (g0[i] * w[i] - a0 - (x0[i] - m0) * r0 * c0);
    d1[i] = r1 * (g1[i] * w[i] - a1 - (x1[i] - m1) * r1 * c1);
    d2[i] = r2 * (g2[i] * w[i] - a2 - (x2[i] - m2) * r2 * c2);
    d3[i] = r3 * (g3[i] * w[i] - a3 - (x3[i] - m3) * r3 * c3);
  }
}

template <typename T>
void backward_rows(const T* g, const T* x, const T* w, const T* mean, const T* rstd, T* dx, T* dw, T* db, int64_t n,
                   int64_t lo, int64_t hi) {
  int64_t r = lo;
  for (; r + 4 <= hi; r += 4) backward_four(g, x, w, mean, rstd, dx, dw, db, n, r);
  for (; r < hi; ++r) backward_one(g, x, w, mean, rstd, dx, dw, db, n, r);
}

void check(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type(), "layer_norm: ",
              name, " must be a contiguous CPU tensor of x's dtype");
}

}  // namespace

// x (..., n), weight (n,), bias (n,) or None -> {y (..., n), mean (rows,), rstd (rows,)}
std::vector<at::Tensor> layer_norm_forward(const at::Tensor& x, const at::Tensor& w,
                                           const std::optional<at::Tensor>& bias, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, "layer_norm: float32 or float64");
  check(x, x, "x");
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  check(w, x, "weight");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n, "layer_norm: weight must be (", n, ",)");
  if (bias) {
    check(*bias, x, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "layer_norm: bias must be (", n, ",)");
  }
  at::Tensor y = at::empty_like(x), mean = at::empty({rows}, x.options()), rstd = at::empty({rows}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_forward", [&] {
    const scalar_t* bp = bias ? bias->data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      forward_rows(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), bp, y.data_ptr<scalar_t>(),
                   mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), n, eps, lo, hi);
    });
  });
  return {y, mean, rstd};
}

// -> {dx (..., n), dweight (n,), dbias (n,)}
std::vector<at::Tensor> layer_norm_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& w,
                                            const at::Tensor& mean, const at::Tensor& rstd) {
  check(x, x, "x");
  check(grad, x, "grad");
  check(w, x, "weight");
  TORCH_CHECK(grad.sizes() == x.sizes(), "layer_norm: grad must have x's shape");
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0, threads = at::get_num_threads();
  TORCH_CHECK(w.numel() == n && mean.numel() == rows && rstd.numel() == rows, "layer_norm: saved sizes differ");
  // per thread: dw (n), db (n), the slots a whole number of 64-byte lines apart (no line shared by two threads)
  const int64_t slot_size = (2 * n + 15) / 16 * 16 + 16;
  at::Tensor dx = at::empty_like(x), parts = at::zeros({threads, slot_size}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_backward", [&] {
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      const int64_t slot = at::get_thread_num();
      TORCH_CHECK(slot < threads, "layer_norm: thread ", slot, " of ", threads);
      scalar_t* dw = parts.data_ptr<scalar_t>() + slot * slot_size;
      backward_rows(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                    mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), dw, dw + n, n,
                    lo, hi);
    });
  });
  at::Tensor sums = parts.sum(0);
  return {dx, sums.narrow(0, 0, n), sums.narrow(0, n, n)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &layer_norm_forward, "LayerNorm over the last dimension -> y, mean, rstd");
  m.def("backward", &layer_norm_backward, "-> dx, dweight, dbias");
}
