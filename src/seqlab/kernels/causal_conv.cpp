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
// Work is split over channel ranges (at::parallel_for over 16-channel units, each thread one contiguous range):
// a range owns its channels' weights and gradients for every (b, t), so no two threads write the same place and
// nothing needs a reduction across threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "vec_math.h"

namespace {

using seqlab_vec::exp_;
using seqlab_vec::silu_;

constexpr int64_t kBlock = 16;  // channels per unit of work: one 64-byte line of floats; a thread takes its
                                // units as one contiguous channel range, so the vector loops run its whole width

struct Shape {
  int64_t b, t, c, k;
};

// in[bi, τ, c0..c1) for τ in [−(k − 1), t): a pointer to the row (channel stride 1)
template <typename T>
inline const T* row(const T* x, const T* s, const Shape& n, int64_t bi, int64_t tau) {
  return tau >= 0 ? x + (bi * n.t + tau) * n.c : s + (bi * (n.k - 1) + (n.k - 1 + tau)) * n.c;
}

// pre[c - c0] = bias + Σ_j w[j] ⊙ in[t − (k − 1) + j] for the block's channels at (bi, t)
template <typename T>
inline void conv_at(const T* x, const T* s, const T* w, const T* bias, const Shape& n, int64_t bi, int64_t t,
                    int64_t c0, int64_t c1, T* pre) {
  for (int64_t c = c0; c < c1; ++c) pre[c - c0] = bias ? bias[c] : T(0);
  for (int64_t j = 0; j < n.k; ++j) {
    const T* in = row(x, s, n, bi, t - (n.k - 1) + j);
    const T* wj = w + j * n.c;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) pre[c - c0] += wj[c] * in[c];
  }
}

template <typename T>
void forward_block(const T* x, const T* s, const T* w, const T* bias, T* y, const Shape& n, int64_t c0, int64_t c1) {
  std::vector<T> buffer(c1 - c0);
  T* pre = buffer.data();
  for (int64_t bi = 0; bi < n.b; ++bi)
    for (int64_t t = 0; t < n.t; ++t) {
      conv_at(x, s, w, bias, n, bi, t, c0, c1, pre);
      T* out = y + (bi * n.t + t) * n.c;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) out[c] = silu_(pre[c - c0]);
    }
}

template <typename T>
void backward_block(const T* g, const T* x, const T* s, const T* w, const T* bias, T* dx, T* ds, T* dw, T* db,
                    const Shape& n, int64_t c0, int64_t c1) {
  std::vector<T> buffer(2 * (c1 - c0));
  T *pre = buffer.data(), *dpre = pre + (c1 - c0);
  for (int64_t bi = 0; bi < n.b; ++bi)
    for (int64_t t = 0; t < n.t; ++t) {
      conv_at(x, s, w, bias, n, bi, t, c0, c1, pre);  // recomputed: cheaper than saving (b, t, c)
      const T* gr = g + (bi * n.t + t) * n.c;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        const T p = pre[c - c0], e = exp_(-p);
        const T sig = T(1) / (T(1) + e);
        dpre[c - c0] = gr[c] * (sig + p * sig * (e * sig));  // σ(1 − σ) = σ · e σ, without cancellation
        db[c] += dpre[c - c0];
      }
      for (int64_t j = 0; j < n.k; ++j) {
        const int64_t tau = t - (n.k - 1) + j;
        const T* in = row(x, s, n, bi, tau);
        T* din = tau >= 0 ? dx + (bi * n.t + tau) * n.c : ds + (bi * (n.k - 1) + (n.k - 1 + tau)) * n.c;
        const T* wj = w + j * n.c;
        T* dwj = dw + j * n.c;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) {
          dwj[c] += dpre[c - c0] * in[c];
          din[c] += dpre[c - c0] * wj[c];
        }
      }
    }
}

Shape check(const at::Tensor& x, const at::Tensor& s, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.is_contiguous(), "causal_conv: x must be contiguous (b, t, c)");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, "causal_conv: float32 or float64");
  const Shape n{x.size(0), x.size(1), x.size(2), w.size(0)};
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

int64_t blocks(const Shape& n) { return (n.c + kBlock - 1) / kBlock; }

}  // namespace

// x (b, t, c), state (b, k - 1, c), w (k, c), bias (c,) or None -> silu(causal depthwise conv) (b, t, c)
at::Tensor causal_conv_silu_forward(const at::Tensor& x, const at::Tensor& state, const at::Tensor& w,
                                    const std::optional<at::Tensor>& bias) {
  const Shape n = check(x, state, w, bias);
  at::Tensor y = at::empty({n.b, n.t, n.c}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_conv_silu_forward", [&] {
    const scalar_t* bp = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, blocks(n), 1, [&](int64_t lo, int64_t hi) {
      forward_block(x.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), bp,
                    y.data_ptr<scalar_t>(), n, lo * kBlock, std::min(n.c, hi * kBlock));
    });
  });
  return y;
}

// -> {dx (b, t, c), dstate (b, k - 1, c), dw (k, c), dbias (c,)}
std::vector<at::Tensor> causal_conv_silu_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& state,
                                                  const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  const Shape n = check(x, state, w, bias);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous(), "causal_conv: grad must be contiguous like x");
  at::Tensor dx = at::zeros_like(x), ds = at::zeros_like(state), dw = at::zeros_like(w);
  at::Tensor db = at::zeros({n.c}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_conv_silu_backward", [&] {
    const scalar_t* bp = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, blocks(n), 1, [&](int64_t lo, int64_t hi) {
      backward_block(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(),
                     w.data_ptr<scalar_t>(), bp, dx.data_ptr<scalar_t>(), ds.data_ptr<scalar_t>(),
                     dw.data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), n, lo * kBlock, std::min(n.c, hi * kBlock));
    });
  });
  return {dx, ds, dw, db};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &causal_conv_silu_forward, "silu(causal depthwise conv1d) on (b, t, c)");
  m.def("backward", &causal_conv_silu_backward, "-> dx, dstate, dw, dbias");
}
