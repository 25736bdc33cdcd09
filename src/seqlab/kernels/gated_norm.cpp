// Mamba-2's gated RMSNorm, out = RMSNorm(y ⊙ silu(z)) ⊙ w over groups of channels, forward and backward, one
// pass over each row's group each way. Built on first use by seqlab/kernels/gated_norm.py.
//
// For one group of m channels of a row, with σ = sigmoid(z):
//   g = y ⊙ z σ,   r = 1 / sqrt(mean(g²) + eps),   n = g r,   out = n ⊙ w
// Backward, with o = dL/dout and ĝ = o ⊙ w:
//   dg = r (ĝ − n mean(ĝ ⊙ n)),   dy = dg ⊙ z σ,   dz = dg ⊙ y σ (1 + z (1 − σ)),   dw = Σ_rows o ⊙ n
//
// Why: as PyTorch ops the norm is about ten elementwise passes over (b, t, d) tensors each way (silu, the
// product, its square, the mean, the scale, the weight; the backward as many again); at the lab's Mamba-2 LM
// they were a tenth of the training step. The forward keeps only r (one value per row and group); the backward
// recomputes σ once per value, keeping n and σ in dy's and dz's own rows between its two passes over a group.
// Rows are split over torch's threads; each thread adds its rows' dw into a buffer of its own (summed at the end).
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
#include <vector>

#include "vec_math.h"

namespace {

constexpr int64_t kGrain = 16384;  // values per task: below this a thread's start-up costs more than it saves

struct Shape {
  int64_t rows, d, m;  // rows, channels per row, channels per group
};

// One group's forward: g into out, then out = g r w; returns r
template <typename T>
inline T forward_group(const T* __restrict__ y, const T* __restrict__ z, const T* __restrict__ w,
                       T* __restrict__ out, int64_t m, double eps) {
  T ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < m; ++i) {
    const T g = y[i] * z[i] * seqlab_vec::sigmoid_(z[i]);
    out[i] = g;
    ss += g * g;
  }
  const T r = T(1) / std::sqrt(ss / T(m) + T(eps));
#pragma omp simd
  for (int64_t i = 0; i < m; ++i) out[i] = out[i] * r * w[i];
  return r;
}

// One group's backward; dw gets this row's o ⊙ n added. Pass 1 keeps n in dy and σ in dz.
template <typename T>
inline void backward_group(const T* __restrict__ o, const T* __restrict__ y, const T* __restrict__ z,
                           const T* __restrict__ w, T r, T* __restrict__ dy, T* __restrict__ dz,
                           T* __restrict__ dw, int64_t m) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < m; ++i) {
    const T sg = seqlab_vec::sigmoid_(z[i]);
    const T n = y[i] * z[i] * sg * r;
    s += o[i] * w[i] * n;
    dw[i] += o[i] * n;
    dy[i] = n, dz[i] = sg;
  }
  const T c = s / T(m);
#pragma omp simd
  for (int64_t i = 0; i < m; ++i) {
    const T sg = dz[i], dg = r * (o[i] * w[i] - dy[i] * c);
    dy[i] = dg * z[i] * sg;
    dz[i] = dg * y[i] * sg * (1 + z[i] * (1 - sg));
  }
}

void check(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type(), "gated_norm: ",
              name, " must be a contiguous CPU tensor of y's dtype");
}

Shape shape_of(const at::Tensor& y, const at::Tensor& z, const at::Tensor& w, int64_t group_size) {
  TORCH_CHECK(y.scalar_type() == at::kFloat || y.scalar_type() == at::kDouble, "gated_norm: float32 or float64");
  check(y, y, "y");
  check(z, y, "z");
  check(w, y, "weight");
  TORCH_CHECK(y.dim() >= 1 && z.sizes() == y.sizes(), "gated_norm: z must have y's shape");
  const int64_t d = y.size(-1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == d, "gated_norm: weight must be (", d, ",)");
  TORCH_CHECK(group_size > 0 && d % group_size == 0, "gated_norm: group_size ", group_size, " must divide ", d);
  return {d ? y.numel() / d : 0, d, group_size};
}

int64_t grain_rows(int64_t d) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1)); }

}  // namespace

// y, z (..., d), weight (d,) -> {out (..., d), rstd (rows, d / group_size)}
std::vector<at::Tensor> gated_norm_forward(const at::Tensor& y, const at::Tensor& z, const at::Tensor& w,
                                           int64_t group_size, double eps) {
  const Shape s = shape_of(y, z, w, group_size);
  const int64_t groups = s.m ? s.d / s.m : 0;
  at::Tensor out = at::empty_like(y), rstd = at::empty({s.rows, groups}, y.options());
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "gated_norm_forward", [&] {
    const scalar_t *yp = y.data_ptr<scalar_t>(), *zp = z.data_ptr<scalar_t>(), *wp = w.data_ptr<scalar_t>();
    scalar_t *op = out.data_ptr<scalar_t>(), *rp = rstd.data_ptr<scalar_t>();
    at::parallel_for(0, s.rows, grain_rows(s.d), [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t row = lo; row < hi; ++row)
        for (int64_t j = 0; j < groups; ++j) {
          const int64_t o = row * s.d + j * s.m;
          rp[row * groups + j] = forward_group(yp + o, zp + o, wp + j * s.m, op + o, s.m, eps);
        }
    });
  });
  return {out, rstd};
}

// -> {dy, dz (..., d), dweight (d,)}
std::vector<at::Tensor> gated_norm_backward(const at::Tensor& grad, const at::Tensor& y, const at::Tensor& z,
                                            const at::Tensor& w, const at::Tensor& rstd, int64_t group_size) {
  const Shape s = shape_of(y, z, w, group_size);
  check(grad, y, "grad");
  check(rstd, y, "rstd");
  TORCH_CHECK(grad.sizes() == y.sizes(), "gated_norm: grad must have y's shape");
  const int64_t groups = s.d / s.m, threads = at::get_num_threads();
  TORCH_CHECK(rstd.numel() == s.rows * groups, "gated_norm: rstd must hold ", s.rows * groups, " values");
  const int64_t slot_size = (s.d + 15) / 16 * 16 + 16;  // per thread, whole 64-byte lines apart
  at::Tensor dy = at::empty_like(y), dz = at::empty_like(z), parts = at::zeros({threads, slot_size}, y.options());
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "gated_norm_backward", [&] {
    const scalar_t *gp = grad.data_ptr<scalar_t>(), *yp = y.data_ptr<scalar_t>(), *zp = z.data_ptr<scalar_t>();
    const scalar_t *wp = w.data_ptr<scalar_t>(), *rp = rstd.data_ptr<scalar_t>();
    scalar_t *dyp = dy.data_ptr<scalar_t>(), *dzp = dz.data_ptr<scalar_t>();
    at::parallel_for(0, s.rows, grain_rows(s.d), [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;
      const int64_t slot = at::get_thread_num();
      TORCH_CHECK(slot < threads, "gated_norm: thread ", slot, " of ", threads);
      scalar_t* dw = parts.data_ptr<scalar_t>() + slot * slot_size;
      for (int64_t row = lo; row < hi; ++row)
        for (int64_t j = 0; j < groups; ++j) {
          const int64_t o = row * s.d + j * s.m;
          backward_group(gp + o, yp + o, zp + o, wp + j * s.m, rp[row * groups + j], dyp + o, dzp + o,
                         dw + j * s.m, s.m);
        }
    });
  });
  return {dy, dz, parts.sum(0).narrow(0, 0, s.d)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &gated_norm_forward, "RMSNorm(y * silu(z)) * weight over groups -> out, rstd");
  m.def("backward", &gated_norm_backward, "-> dy, dz, dweight");
}
