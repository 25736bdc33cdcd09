// minGRU's recurrence, forward and backward, in one pass over the sequence each way. Built on first use by
// mingru_scan.py.
//
// Notation: b batch, t time, e hidden width. The input is the layer's projection ku (b, t, 2e), rows [k | u]:
// the gate and candidate pre-activations. With z = σ(k), 1 - z = σ(-k) and h̃ = g(u) (g(u) = u + 1/2 for u >= 0,
// σ(u) below):
//
//   h_t = a_t ⊙ h_{t-1} + b_t,   a_t = σ(-k_t),   b_t = σ(k_t) g(u_t)
//
// The recurrence is elementwise, so on a CPU one sequential pass, vectorized over channels and threaded over
// (batch row, block of channels), does the least work: t steps of one multiply-add, where the log-space scan
// (the layer's parallel form, for parallel hardware) runs cumsum, logcumsumexp and its exps over every chunk.
// Linear space is also the reference loop's own arithmetic: no logarithms, no cancellation.
//
// Backward, with G_t = dL/dh_t from the output and c_t = G_t + a_{t+1} c_{t+1} (c past the end is 0):
//
//   dk_t = c_t σ(k_t) σ(-k_t) (g(u_t) - h_{t-1}),   du_t = c_t σ(k_t) g'(u_t),   dh_0 = a_1 c_1
//
// with g'(u) = 1 for u >= 0, σ(u) σ(-u) below. h_{t-1} is read from the saved output (h_0 at the first step);
// nothing else is saved.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vec_math.h"

namespace {

using seqlab_vec::exp_;

constexpr int64_t kBlock = 32;  // channels per unit of work (two 64-byte lines of floats)

struct Shape {
  int64_t b, t, e;
  int64_t ld;  // ku's row stride (2e when contiguous)
};

// σ(k) and σ(-k) from one exp of -|k|, neither as 1 minus the other (1 - σ(k) would round to 0 for k > 17 in
// float32, where σ(-k) stays exact)
template <typename T>
inline void gates(T k, T& z, T& one_minus_z) {
  const T ak = k < T(0) ? -k : k;
  const T e = exp_(-ak);
  const T big = T(1) / (T(1) + e), small = e * big;  // σ(|k|), σ(-|k|)
  z = k >= T(0) ? big : small;
  one_minus_z = k >= T(0) ? small : big;
}

// g(u) and g'(u), from one exp of -|u|
template <typename T>
inline void candidate(T u, T& g, T& dg) {
  const T au = u < T(0) ? -u : u;
  const T e = exp_(-au);
  const T big = T(1) / (T(1) + e), small = e * big;  // for u < 0: σ(-u) and σ(u)
  g = u >= T(0) ? u + T(0.5) : small;
  dg = u >= T(0) ? T(1) : small * big;
}

// h for channels [c0, c1) of batch row bi, every step
template <typename T>
void forward_unit(const T* ku, const T* h0, T* h, const Shape& n, int64_t bi, int64_t c0, int64_t c1) {
  const int64_t w = c1 - c0;
  T state[kBlock];
  for (int64_t j = 0; j < w; ++j) state[j] = h0[bi * n.e + c0 + j];
  for (int64_t s = 0; s < n.t; ++s) {
    const T* k = ku + (bi * n.t + s) * n.ld + c0;
    const T* u = k + n.e;
    T* out = h + (bi * n.t + s) * n.e + c0;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      T z, keep, g, dg;
      gates(k[j], z, keep);
      candidate(u[j], g, dg);
      state[j] = keep * state[j] + z * g;
      out[j] = state[j];
    }
  }
}

// dku and dh0 for channels [c0, c1) of batch row bi, the steps in reverse
template <typename T>
void backward_unit(const T* grad, const T* ku, const T* h0, const T* h, T* dku, T* dh0, const Shape& n, int64_t bi,
                   int64_t c0, int64_t c1) {
  const int64_t w = c1 - c0;
  T carry[kBlock] = {};  // a_{t+1} c_{t+1}
  for (int64_t s = n.t - 1; s >= 0; --s) {
    const int64_t row = bi * n.t + s;
    const T* k = ku + row * n.ld + c0;
    const T* u = k + n.e;
    const T* g_out = grad + row * n.e + c0;
    const T* prev = s > 0 ? h + (row - 1) * n.e + c0 : h0 + bi * n.e + c0;
    T* dk = dku + row * 2 * n.e + c0;
    T* du = dk + n.e;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      T z, keep, g, dg;
      gates(k[j], z, keep);
      candidate(u[j], g, dg);
      const T c = g_out[j] + carry[j];
      dk[j] = c * z * keep * (g - prev[j]);
      du[j] = c * z * dg;
      carry[j] = keep * c;
    }
  }
  for (int64_t j = 0; j < w; ++j) dh0[bi * n.e + c0 + j] = carry[j];
}

Shape check(const at::Tensor& ku, const at::Tensor& h0) {
  TORCH_CHECK(ku.device().is_cpu() && h0.device().is_cpu(), "mingru_scan: CPU tensors only");
  TORCH_CHECK(ku.scalar_type() == at::kFloat || ku.scalar_type() == at::kDouble, "mingru_scan: float32 or float64");
  TORCH_CHECK(ku.dim() == 3 && ku.size(2) % 2 == 0 && ku.stride(2) == 1 && ku.stride(1) >= ku.size(2) &&
                  ku.stride(0) == ku.size(1) * ku.stride(1),
              "mingru_scan: ku must be (b, t, 2e) with contiguous channels and evenly spaced rows");
  const Shape n{ku.size(0), ku.size(1), ku.size(2) / 2, ku.stride(1)};
  TORCH_CHECK(h0.dim() == 2 && h0.size(0) == n.b && h0.size(1) == n.e && h0.is_contiguous() &&
                  h0.scalar_type() == ku.scalar_type(),
              "mingru_scan: h0 must be a contiguous (b, e) tensor of ku's dtype");
  return n;
}

int64_t blocks(const Shape& n) { return (n.e + kBlock - 1) / kBlock; }

}  // namespace

// ku (b, t, 2e), h0 (b, e) -> h (b, t, e)
at::Tensor mingru_scan_forward(const at::Tensor& ku, const at::Tensor& h0) {
  const Shape n = check(ku, h0);
  at::Tensor h = at::empty({n.b, n.t, n.e}, ku.options());
  const int64_t per_row = blocks(n);
  AT_DISPATCH_FLOATING_TYPES(ku.scalar_type(), "mingru_scan_forward", [&] {
    at::parallel_for(0, n.b * per_row, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t bi = unit / per_row, c0 = (unit % per_row) * kBlock;
        forward_unit(ku.data_ptr<scalar_t>(), h0.data_ptr<scalar_t>(), h.data_ptr<scalar_t>(), n, bi, c0,
                     std::min(n.e, c0 + kBlock));
      }
    });
  });
  return h;
}

// -> {dku (b, t, 2e), dh0 (b, e)}, given grad = dL/dh (b, t, e) and the forward's output h
std::vector<at::Tensor> mingru_scan_backward(const at::Tensor& grad, const at::Tensor& ku, const at::Tensor& h0,
                                             const at::Tensor& h) {
  const Shape n = check(ku, h0);
  for (const auto* x : {&grad, &h})
    TORCH_CHECK(x->sizes() == at::IntArrayRef({n.b, n.t, n.e}) && x->is_contiguous() &&
                    x->scalar_type() == ku.scalar_type(),
                "mingru_scan: grad and h must be contiguous (b, t, e) tensors of ku's dtype");
  at::Tensor dku = at::empty({n.b, n.t, 2 * n.e}, ku.options()), dh0 = at::empty({n.b, n.e}, ku.options());
  const int64_t per_row = blocks(n);
  AT_DISPATCH_FLOATING_TYPES(ku.scalar_type(), "mingru_scan_backward", [&] {
    at::parallel_for(0, n.b * per_row, 1, [&](int64_t lo, int64_t hi) {
      seqlab_vec::FlushDenormals flush;  // this task: subnormals flushed (vec_math.h)
      for (int64_t unit = lo; unit < hi; ++unit) {
        const int64_t bi = unit / per_row, c0 = (unit % per_row) * kBlock;
        backward_unit(grad.data_ptr<scalar_t>(), ku.data_ptr<scalar_t>(), h0.data_ptr<scalar_t>(),
                      h.data_ptr<scalar_t>(), dku.data_ptr<scalar_t>(), dh0.data_ptr<scalar_t>(), n, bi, c0,
                      std::min(n.e, c0 + kBlock));
      }
    });
  });
  return {dku, dh0};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &mingru_scan_forward, "minGRU's recurrence: ku (b, t, 2e), h0 (b, e) -> h (b, t, e)");
  m.def("backward", &mingru_scan_backward, "-> dku (b, t, 2e), dh0 (b, e)");
}
