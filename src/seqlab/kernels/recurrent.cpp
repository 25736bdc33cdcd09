// seqlab's fused CPU kernels for one layer, one direction of a tanh/ReLU RNN, a GRU or an LSTM (torch.nn's
// equations, parameter layout and gate orders [r, z, n] and [i, f, g, o]). Built on first use by
// seqlab/kernels/recurrent.py.
//
// Notation: t time, b batch, H hidden size, G = gates * H (H for the RNN, 3H for the GRU, 4H for the LSTM).
// Every buffer is time-major and contiguous: x (t, b, in), out (t, b, H), so step s is the contiguous block [s]
// (the GRU's and the LSTM's dL/dout alone are read where their rows lie).
//
// Forward:   gx = x W_ih^T + b_ih                 one matmul for all steps: (t*b, in) x (in, G) -> (t*b, G)
//            per step: gh = h_{s-1} W_hh^T (+ b_hh)  one matmul (b, H) x (H, G) -> (b, G) into a reused buffer,
//            then ONE loop over the b*H elements that applies the gates and writes h_s into out[s].
// Backward:  per step, in reverse: one loop for the gate gradients, one matmul dgh[s] W_hh for dL/dh_{s-1};
//            after the loop dW_ih, dW_hh and dx are one matmul each over all steps; the bias gradients are summed
//            in the loop beside the larger steps (add_rows), after it beside the small ones.
//
// Saved for the backward: out (the h_s), for the GRU its gates r, z, n and W_hn h + b_hn, for the LSTM its gates
// i, f, g, o and its cell state c_s: O(t*b*H).
//
// The LSTM with a projection (LSTMP, Sak et al. 2014; torch.nn's proj_size P): m_s = o ⊙ tanh(c_s) is H wide and
// the state it carries and outputs is h_s = W_hr m_s, P wide, so that out is (t, b, P), W_hh (4H, P) and a step
// has a second product, (b, H) x (H, P). The m_s are saved too (t, b, H); the backward's dL/dm_s = dL/dh_s W_hr
// feeds the gate loop, and dW_hr = Σ_s dL/dh_sᵀ m_s is one product after the loop. Below, R is the width of the
// state carried from step to step (P, else H).
// Narrow includes rather than <torch/extension.h>: they halve the first build's time.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/accumulate.h>
#include <torch/version.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <array>
#include <initializer_list>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "vec_math.h"

namespace {

constexpr int64_t kTanh = 0, kRelu = 1, kGru = 2, kLstm = 3;

// G / H, and the width of a step's saved row in ws (0: nothing saved; the RNN's backward reads out alone)
inline int64_t n_gates(int64_t mode) { return mode == kGru ? 3 : mode == kLstm ? 4 : 1; }
inline int64_t saved_width(int64_t mode) { return mode == kGru ? 4 : mode == kLstm ? 5 : 0; }

// ---- activations -------------------------------------------------------------------------------------------
// float: exp by range reduction x = n ln2 + r and Cephes' degree-6 polynomial for e^r (about 2 ulp), written
// branch-free so that the compiler vectorizes the gate loops; tanh and the sigmoid follow from it (absolute error
// below 1e-7). double: the C library, so that float64 matches torch.nn to rounding.

inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;  // keeps 2^n a normal float
  x = x > 88.0f ? 88.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer, branch-free
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln2, ln2 split in two for precision
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);  // 2^n
  return p * scale;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }
inline float tanh_(float x) { return 2.0f / (1.0f + exp_approx(-2.0f * x)) - 1.0f; }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double tanh_(double x) { return std::tanh(x); }

// ---- one step's elementwise work, one row (one sequence of the batch) at a time ------------------------------

// GRU: r, z = σ(gx_{r,z} + gh_{r,z}); n = tanh(gx_n + r ⊙ gh_n); h = (1 - z) ⊙ n + z ⊙ h_prev.
// gh already holds W_hh h_prev + b_hh. ws receives [r | z | n | gh_n], each H long.
template <typename T>
void gru_forward_row(const T* __restrict__ gx, const T* __restrict__ gh, const T* __restrict__ hp,
                     T* __restrict__ h, T* __restrict__ ws, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = sigmoid(gx[j] + gh[j]);
    const T z = sigmoid(gx[H + j] + gh[H + j]);
    const T hn = gh[2 * H + j];
    const T n = tanh_(gx[2 * H + j] + r * hn);
    ws[j] = r;
    ws[H + j] = z;
    ws[2 * H + j] = n;
    ws[3 * H + j] = hn;
    h[j] = n + z * (hp[j] - n);
  }
}

// GRU backward for one row. dh: in, dL/dh_s from later steps; out, the part of dL/dh_{s-1} that flows through
// z ⊙ h_prev (the matmul adds the rest). dgx: dL/d(gx), dgh: dL/d(gh), each [r | z | n].
template <typename T>
void gru_backward_row(const T* __restrict__ go, const T* __restrict__ ws, const T* __restrict__ hp,
                      T* __restrict__ dh, T* __restrict__ dgx, T* __restrict__ dgh, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T g = dh[j] + go[j];
    const T r = ws[j], z = ws[H + j], n = ws[2 * H + j], hn = ws[3 * H + j];
    const T dn = g * (T(1) - z) * (T(1) - n * n);  // through tanh
    const T dr = dn * hn * r * (T(1) - r);          // through σ
    const T dz = g * (hp[j] - n) * z * (T(1) - z);
    dgx[j] = dr;
    dgx[H + j] = dz;
    dgx[2 * H + j] = dn;
    dgh[j] = dr;
    dgh[H + j] = dz;
    dgh[2 * H + j] = dn * r;
    dh[j] = g * z;
  }
}

// RNN: h = act(W_hh h_prev + gx), in place over the output row that already holds W_hh h_prev (adding gx here
// rather than as the matmul's input saves a copy per step).
template <typename T>
void rnn_forward_row(T* __restrict__ h, const T* __restrict__ gx, int64_t H, bool relu) {
  if (relu) {
    for (int64_t j = 0; j < H; ++j) {
      const T pre = h[j] + gx[j];
      h[j] = pre > T(0) ? pre : T(0);
    }
  } else {
    for (int64_t j = 0; j < H; ++j) h[j] = tanh_(h[j] + gx[j]);
  }
}

// RNN backward for one row: dpre = (dL/dh_s) ⊙ act'(pre), with act' read from h_s itself.
template <typename T>
void rnn_backward_row(const T* __restrict__ go, const T* __restrict__ h, const T* __restrict__ dh,
                      T* __restrict__ dpre, int64_t H, bool relu) {
  if (relu) {
    for (int64_t j = 0; j < H; ++j) dpre[j] = h[j] > T(0) ? dh[j] + go[j] : T(0);
  } else {
    for (int64_t j = 0; j < H; ++j) dpre[j] = (dh[j] + go[j]) * (T(1) - h[j] * h[j]);
  }
}

// LSTM: i, f, o = σ(gx + gh) and g = tanh(gx + gh) in their columns; c = f ⊙ c_prev + i ⊙ g; h = o ⊙ tanh(c).
// gh holds W_hh h_prev (both biases are in gx). ws receives [i | f | g | o | c], each H long.
template <typename T>
void lstm_forward_row(const T* __restrict__ gx, const T* __restrict__ gh, const T* __restrict__ cp,
                      T* __restrict__ h, T* __restrict__ ws, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = sigmoid(gx[j] + gh[j]);
    const T f = sigmoid(gx[H + j] + gh[H + j]);
    const T g = tanh_(gx[2 * H + j] + gh[2 * H + j]);
    const T o = sigmoid(gx[3 * H + j] + gh[3 * H + j]);
    const T c = f * cp[j] + i * g;
    ws[j] = i;
    ws[H + j] = f;
    ws[2 * H + j] = g;
    ws[3 * H + j] = o;
    ws[4 * H + j] = c;
    h[j] = o * tanh_(c);
  }
}

// LSTM backward for one row. dh: dL/dh_s from later steps (the matmul's); dc: in, dL/dc_s from later steps, out,
// dL/dc_{s-1}; dg: dL/d(gx + gh) = [di | df | dg | do]. tanh(c) is recomputed: one exp is cheaper than a sixth
// saved row read back from memory.
template <typename T>
void lstm_backward_row(const T* __restrict__ go, const T* __restrict__ ws, const T* __restrict__ cp,
                       const T* __restrict__ dh, T* __restrict__ dc, T* __restrict__ dg, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T gh = dh[j] + go[j];
    const T i = ws[j], f = ws[H + j], g = ws[2 * H + j], o = ws[3 * H + j], tc = tanh_(ws[4 * H + j]);
    const T dct = dc[j] + gh * o * (T(1) - tc * tc);  // through h = o ⊙ tanh(c), plus the later steps'
    dg[j] = dct * g * i * (T(1) - i);
    dg[H + j] = dct * cp[j] * f * (T(1) - f);
    dg[2 * H + j] = dct * i * (T(1) - g * g);
    dg[3 * H + j] = gh * tc * o * (T(1) - o);
    dc[j] = dct * f;
  }
}

// The LSTM's c_{s-1} for the k-th step of the recurrence, whose saved rows start at wss: {first row, row stride},
// c0's rows (H apart) at the first step, else the saved c of the step before in the recurrence (W = 5H apart)
template <typename T>
std::pair<const T*, int64_t> previous_cell(const T* c0, const T* wss, int64_t k, bool reverse, int64_t B, int64_t H) {
  const int64_t W = saved_width(kLstm) * H;
  if (k == 0) return {c0, H};
  return {wss + (reverse ? B : -B) * W + 4 * H, W};
}

// Padded batches (right padding): lengths (b,) int64, each in [1, t], longest first (as pack_padded_sequence sorts
// them); position s of row i is padding when s >= its length. So a step's real rows are a prefix, its first
// active(s) rows, and the step's products and gate loops run on those alone (a packed sequence's work); the rows
// after it hold their state, h_s = h_{s-1} (and the LSTM's c_s = c_{s-1}), so a reverse recurrence starts at each
// row's own end, and the gradient passes a held step unchanged with no gate gradient. Null without padding.
const int64_t* checked_lengths(const std::optional<at::Tensor>& lengths, int64_t T, int64_t B) {
  if (!lengths.has_value()) return nullptr;
  const at::Tensor& l = *lengths;
  TORCH_CHECK(l.dim() == 1 && l.size(0) == B && l.scalar_type() == at::kLong && l.device().is_cpu() &&
                  l.is_contiguous(),
              "lengths must be a contiguous int64 CPU tensor (b,) = (", B, ",), got ", l.scalar_type(), " ", l.sizes());
  const int64_t* p = l.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK(p[i] >= 1 && p[i] <= T, "every length must lie in [1, t = ", T, "], got ", p[i]);
    TORCH_CHECK(i == 0 || p[i] <= p[i - 1], "lengths must be sorted longest first, got ", l);
  }
  return p;
}

// out's first rows = a's first rows times w, through MKL (the narrowed views made only on this path)
void mm_rows(const at::Tensor& out, const at::Tensor& a, const at::Tensor& w, int64_t rows) {
  at::Tensor head = out.narrow(0, 0, rows);
  at::mm_out(head, a.narrow(0, 0, rows), w);
}

// The rows of step s that are real: all B without lengths, else those whose length exceeds s (a prefix)
inline int64_t active(const int64_t* lens, int64_t B, int64_t s) {
  int64_t n = lens ? 0 : B;
  while (n < B && lens[n] > s) ++n;
  return n;
}

// The forward's arguments, before any buffer is sized from them: every row the loops read must exist (an h0 of
// another batch, a w_hh of another width or a missing b_hh would otherwise be read out of bounds).
void check(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& w_ih, const at::Tensor& w_hh,
           const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh, int64_t mode,
           const std::optional<at::Tensor>& c0, const std::optional<at::Tensor>& w_hr) {
  TORCH_CHECK(mode == kTanh || mode == kRelu || mode == kGru || mode == kLstm,
              "mode must be 0 (tanh), 1 (relu), 2 (GRU) or 3 (LSTM), got ", mode);
  TORCH_CHECK(x.dim() == 3 && h0.dim() == 2, "expected x (t, b, in) and h0 (b, H), got x ", x.sizes(), " and h0 ",
              h0.sizes());
  TORCH_CHECK(h0.size(0) == x.size(1), "h0 must be (b, H) with x's batch b = ", x.size(1), ", got ", h0.sizes());
  TORCH_CHECK(!w_hr.has_value() || mode == kLstm, "only the LSTM takes a projection w_hr");
  TORCH_CHECK(!w_hr.has_value() || (w_hr->dim() == 2 && w_hr->size(0) == h0.size(1)),
              "w_hr must be (P, H) with P = h0's width ", h0.size(1), ", got ", w_hr.has_value() ? w_hr->sizes() : h0.sizes());
  const int64_t R = h0.size(1), H = w_hr.has_value() ? w_hr->size(1) : R, G = n_gates(mode) * H;
  TORCH_CHECK(c0.has_value() == (mode == kLstm), "the LSTM takes a cell state c0 and the other modes none");
  TORCH_CHECK(!c0.has_value() || c0->sizes() == at::IntArrayRef({h0.size(0), H}), "c0 must be (b, H) = (", h0.size(0),
              ", ", H, "), got ", c0.has_value() ? c0->sizes() : h0.sizes());
  TORCH_CHECK(w_ih.dim() == 2 && w_ih.size(0) == G && w_ih.size(1) == x.size(2), "w_ih must be (G, in) = (", G,
              ", ", x.size(2), "), got ", w_ih.sizes());
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(0) == G && w_hh.size(1) == R, "w_hh must be (G, ",
              w_hr.has_value() ? "P" : "H", ") = (", G, ", ", R, "), got ", w_hh.sizes());
  TORCH_CHECK(b_ih.has_value() == b_hh.has_value(), "give both biases b_ih and b_hh or neither");
  for (const auto* b : {&b_ih, &b_hh})
    if (b->has_value())
      TORCH_CHECK((*b)->dim() == 1 && (*b)->size(0) == G, "the biases must be (G,) = (", G, ",), got ",
                  (*b)->sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "seqlab's recurrent kernel takes float32 or float64, got ", x.scalar_type());
  std::vector<const at::Tensor*> all = {&x, &h0, &w_ih, &w_hh};
  if (b_ih.has_value()) all.insert(all.end(), {&*b_ih, &*b_hh});
  if (c0.has_value()) all.push_back(&*c0);
  if (w_hr.has_value()) all.push_back(&*w_hr);
  for (const auto* t : all) {
    TORCH_CHECK(t->device().is_cpu(), "seqlab's recurrent kernel runs on CPU tensors only, got ", t->device());
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "x, h0, the weights and the biases must share one dtype, got ",
                t->scalar_type(), " and x ", x.scalar_type());
  }
}

// The backward's arguments: what the forward returned for these inputs, and gradients of out's and h_n's shapes.
void check_backward(const std::optional<at::Tensor>& grad_out, const std::optional<at::Tensor>& grad_hn,
                    const std::optional<at::Tensor>& grad_cn,
                    const at::Tensor& x, const at::Tensor& h0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                    const at::Tensor& out, const at::Tensor& ws, int64_t mode,
                    const std::optional<at::Tensor>& c0, const std::optional<at::Tensor>& w_hr,
                    const std::optional<at::Tensor>& ms) {
  check(x, h0, w_ih, w_hh, std::nullopt, std::nullopt, mode, c0, w_hr);
  const int64_t T = x.size(0), B = x.size(1), R = h0.size(1), H = w_hh.size(0) / n_gates(mode);
  TORCH_CHECK(out.sizes() == at::IntArrayRef({T, B, R}) && out.is_contiguous() &&
                  out.scalar_type() == x.scalar_type(),
              "out must be the forward's contiguous (t, b, R) = (", T, ", ", B, ", ", R, "), got ", out.sizes());
  TORCH_CHECK(ms.has_value() == w_hr.has_value() &&
                  (!ms.has_value() || (ms->sizes() == at::IntArrayRef({T, B, H}) && ms->is_contiguous() &&
                                       ms->scalar_type() == x.scalar_type())),
              "with a projection w_hr, ms must be the forward's contiguous (t, b, H) = (", T, ", ", B, ", ", H,
              "), and without one absent");
  const int64_t saved = saved_width(mode) > 0 ? T : 0, width = std::max<int64_t>(saved_width(mode), 4) * H;
  TORCH_CHECK(ws.sizes() == at::IntArrayRef({saved, B, width}) && ws.is_contiguous() &&
                  ws.scalar_type() == x.scalar_type(),
              "ws must be the forward's saved gates (", saved, ", ", B, ", ", width, "), got ", ws.sizes());
  TORCH_CHECK(!grad_out.has_value() ||
                  (grad_out->sizes() == out.sizes() && grad_out->scalar_type() == x.scalar_type()),
              "grad_out must have out's shape ", out.sizes(), " and dtype");
  TORCH_CHECK(!grad_hn.has_value() ||
                  (grad_hn->sizes() == h0.sizes() && grad_hn->scalar_type() == x.scalar_type()),
              "grad_hn must have h0's shape ", h0.sizes(), " and dtype");
  TORCH_CHECK(!grad_cn.has_value() || (mode == kLstm && grad_cn->sizes() == c0->sizes() &&
                                       grad_cn->scalar_type() == x.scalar_type()),
              "grad_cn must be the LSTM's, of c0's shape and dtype");
}

// A fresh buffer for O(t*b*H) data. Above a few MB the allocator hands out newly mapped memory, and on Linux
// its first touch costs a page fault per 4 KB page: about 1 ms per MB here, a third of a GRU's forward +
// backward at t=400. Asking for transparent huge pages first (a hint, as torch's THP_MEM_ALLOC_ENABLE does)
// makes that one fault per 2 MB.
at::Tensor buffer(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty(sizes, options);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = (begin + t.nbytes()) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // failure is fine
#endif
  return t;
}

at::Tensor contiguous_buffer(const at::Tensor& t) {
  return t.is_contiguous() ? t : buffer(t.sizes(), t.options()).copy_(t);
}

// Scratch that lives only within one call (the input projection gx, the gate gradients dgh and dgx, a contiguous
// copy of dL/dout): one buffer per role and thread, kept between calls and grown when a call needs more. Fresh
// memory is zeroed by the kernel page by page on first touch, and that zeroing was a twentieth of an RNN's
// fwd + bwd on one thread (t=400); a kept buffer is already mapped. What is kept is the largest scratch a
// thread has needed, about 3 (t, b, G) floats.
enum Scratch { kGx = 0, kGo, kDgh, kDgx, kT, kRoles };

at::Tensor scratch(Scratch role, at::IntArrayRef sizes, const at::TensorOptions& options) {
  thread_local std::array<at::Tensor, kRoles> kept;
  at::Tensor& t = kept[role];
  const int64_t n = c10::multiply_integers(sizes);
  if (!t.defined() || t.scalar_type() != options.dtype().toScalarType() || t.numel() < n) {
    // a normal tensor even when the call runs under torch.inference_mode (generate): an inference tensor kept
    // here could not be written in place by a later call outside it (a training step after sampling)
    c10::InferenceMode normal(false);
    t = buffer({std::max<int64_t>(n, 1)}, options);
  }
  return t.narrow(0, 0, n).view(sizes);
}

at::Tensor contiguous_scratch(Scratch role, const at::Tensor& t) {
  return t.is_contiguous() ? t : scratch(role, t.sizes(), t.options()).copy_(t);
}

// ---- small per-step products -------------------------------------------------------------------------------
// At the lab's widths a step's product is tiny (b 8, H 40: 8 x 40 x 120 multiply-adds for a GRU), and a call into
// the BLAS through torch's dispatcher, with a tensor made for the step's rows, costs more than the arithmetic. Up
// to 160K (5 x 2^15) multiply-adds a step the steps multiply in vector loops over raw pointers on the calling
// thread (float32 with AVX-512: small_product<float> below). Measured fwd + bwd on a quiet 2-core AMD EPYC,
// alternating in one process, loops against MKL (the ratio: MKL's time over the loops'): one thread, the GRU at
// b 32, H 40 (153,600) 1.07x, b 16, H 64 (196,608) 1.02x, b 8, H 96 (221,184) 0.96x, b 32, H 64 (393,216) 0.90x;
// the RNN at b 8, H 96 (73,728) 1.27x, b 32, H 64 (131,072) 1.19x, b 16, H 128 (262,144) 1.00x; two threads, the
// GRU 1.14x, 1.00x, 1.02x, 0.82x and the RNN 1.04x, 1.02x, 0.91x at the same shapes. Where the larger steps go
// through oneDNN's brgemm instead (below), the loops stop at 64K (2^16): against brgemm (one thread / two) they
// lost at the GRU's b 8, H 64 (98,304: 0.82x / 0.81x) and the RNN's b 8, H 96 (73,728: 0.85x / 0.79x), were level
// at the RNN's b 32, H 40 (51,200: 0.98x / 0.96x) and won at the GRU's b 8, H 40 (38,400: 1.05x / 1.00x in the
// whole fwd + bwd) and the RNN's b 8, H 40 (12,800: 1.02x / 1.03x).
bool small_steps(int64_t B, int64_t H, int64_t G, bool brgemm) {
  return B * H * G <= (brgemm ? (int64_t(1) << 16) : 5 * (int64_t(1) << 15));
}

// out (rows, cols) = x (rows, inner) w (inner, cols), plus bias (cols) or, when accumulate, plus out itself
template <typename T>
void small_product(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
                   int64_t rows, int64_t inner, int64_t cols, bool accumulate) {
  for (int64_t i = 0; i < rows; ++i) {
    T* o = out + i * cols;
    if (!accumulate)
      for (int64_t c = 0; c < cols; ++c) o[c] = bias ? bias[c] : T(0);
    const T* xi = x + i * inner;
    for (int64_t j = 0; j < inner; ++j) {
      const T xj = xi[j];
      const T* wj = w + j * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) o[c] += xj * wj[c];
    }
  }
}

#if defined(__AVX512F__)
// float with AVX-512: a row's outputs in blocks of up to 8 vectors (128 columns), each block's sums held in
// registers through the whole inner loop. The loop above loads and stores every output vector once per inner
// index, and at b 8, H 40 those store-to-load round trips were about half of a GRU's forward (perf, AMD EPYC).
// w, init and o point at the block's first column; the block's last vector takes the `left` columns that remain.
template <int V>
SEQLAB_VEC_INLINE void row_block(const float* __restrict__ xi, const float* __restrict__ w, const float* init,
                                 float* o, int64_t inner, int64_t cols, int64_t left) {
  const int64_t rest = left - 16 * (V - 1);  // 1..16 columns in the last vector
  const __mmask16 tail = rest >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rest) - 1);
  __m512 acc[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) {
    const __mmask16 m = v == V - 1 ? tail : __mmask16(0xFFFF);
    acc[v] = init ? _mm512_maskz_loadu_ps(m, init + 16 * v) : _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < inner; ++j) {
    const __m512 xj = _mm512_set1_ps(xi[j]);
    const float* wj = w + j * cols;
#pragma GCC unroll 8
    for (int v = 0; v < V - 1; ++v) acc[v] = _mm512_fmadd_ps(xj, _mm512_loadu_ps(wj + 16 * v), acc[v]);
    acc[V - 1] = _mm512_fmadd_ps(xj, _mm512_maskz_loadu_ps(tail, wj + 16 * (V - 1)), acc[V - 1]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < V - 1; ++v) _mm512_storeu_ps(o + 16 * v, acc[v]);
  _mm512_mask_storeu_ps(o + 16 * (V - 1), tail, acc[V - 1]);
}

template <>
void small_product<float>(const float* x, const float* w, const float* bias, float* out, int64_t rows,
                          int64_t inner, int64_t cols, bool accumulate) {
  using Block = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  static constexpr Block blocks[8] = {row_block<1>, row_block<2>, row_block<3>, row_block<4>,
                                      row_block<5>, row_block<6>, row_block<7>, row_block<8>};
  for (int64_t i = 0; i < rows; ++i) {
    float* o = out + i * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const int64_t left = std::min<int64_t>(128, cols - c0);
      const float* init = accumulate ? o + c0 : (bias ? bias + c0 : nullptr);
      blocks[(left + 15) / 16 - 1](x + i * inner, w + c0, init, o + c0, inner, cols, left);
    }
  }
}
#endif

// ---- the larger steps through oneDNN's brgemm ----------------------------------------------------------------
// Past the small limit a step's product went to MKL. oneDNN's brgemm micro-kernel (torch's
// at::native::cpublas::brgemm, float32), one call per thread on its share of the output columns, ran it faster on
// the AMD EPYC, 100 steps alternating in one process: one thread 1.19-1.30x ((32, 256) x (256, 256) 52.6 -> 40.5
// us, x (256, 768) 147 -> 124, (32, 768) x (768, 256) 149 -> 116; two runs), two threads 1.48-1.58x against MKL's
// threaded product (32.4 -> 20.5, 94.4 -> 60.8, 88.2 -> 59.4). float64, builds without AVX-512 and torch before
// 2.13 (where this was measured; the float form of brgemm is recent) keep MKL.
#if defined(__AVX512F__) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13))
#define SEQLAB_BRGEMM_STEPS 1
#else
#define SEQLAB_BRGEMM_STEPS 0
#endif

template <typename T>
bool brgemm_steps() {
  return false;
}

// out (rows, cols) = x (rows, inner) w (inner, cols), plus bias (cols) or, when accumulate, plus out itself
template <typename T>
void brgemm_product(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, bool) {
  TORCH_CHECK(false, "seqlab's recurrent kernel: brgemm steps take float32 only");
}

#if SEQLAB_BRGEMM_STEPS
template <>
bool brgemm_steps<float>() {
  return true;
}

// The output's columns in `parts` shares of whole 16-column vectors, the last share taking the rest
inline int64_t share_start(int64_t cols, int64_t parts, int64_t p) {
  return p >= parts ? cols : cols * p / parts / 16 * 16;
}

inline int64_t brgemm_parts(int64_t cols) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), cols / 64));  // at least 64 columns each
}

template <>
void brgemm_product<float>(const float* x, const float* w, const float* bias, float* out, int64_t rows,
                           int64_t inner, int64_t cols, bool accumulate) {
  const int64_t parts = brgemm_parts(cols);
  at::parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t c0 = share_start(cols, parts, p), c1 = share_start(cols, parts, p + 1);
      if (bias != nullptr && !accumulate)
        for (int64_t i = 0; i < rows; ++i) std::copy(bias + c0, bias + c1, out + i * cols + c0);
      at::native::cpublas::brgemm(rows, c1 - c0, inner, inner, cols, cols, accumulate || bias != nullptr, x,
                                  w + c0, out + c0);
    }
  });
}
#endif

// The whole sequence's products (the input projection x W_ih^T + b, the input gradient dgx W_ih): out (rows, cols)
// = x (rows, inner) w (inner, cols) (+ bias), in blocks of kRowBlock rows, the blocks shared out over the threads.
// Against MKL on the AMD EPYC, one thread, the GRU's (3200, 128) x (128, 768) 6.9 -> 6.3 ms and (3200, 768) x
// (768, 128) 7.1 -> 5.9, the RNN's (3200, 128) x (128, 256) and (3200, 256) x (256, 128) 2.2 -> 1.9 (MKL packs
// both operands of every call; brgemm reads them as they are).
constexpr int64_t kRowBlock = 64;

template <typename T>
void brgemm_rows(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t) {
  TORCH_CHECK(false, "seqlab's recurrent kernel: brgemm products take float32 only");
}

#if SEQLAB_BRGEMM_STEPS
template <>
void brgemm_rows<float>(const float* x, const float* w, const float* bias, float* out, int64_t rows, int64_t inner,
                        int64_t cols) {
  at::parallel_for(0, (rows + kRowBlock - 1) / kRowBlock, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t r0 = blk * kRowBlock, m = std::min(kRowBlock, rows - r0);
      if (bias != nullptr)
        for (int64_t i = r0; i < r0 + m; ++i) std::copy(bias, bias + cols, out + i * cols);
      at::native::cpublas::brgemm(m, cols, inner, inner, cols, cols, bias != nullptr, x + r0 * inner, w,
                                  out + r0 * cols);
    }
  });
}

// The input gradient into x's own layout: out rows (s, i) at out + s * st0 + i * st1 (a batch-first x seen as (t, b,
// in) has st0 = in, st1 = t * in) = dgx rows (s, i) (t*b, inner), time-major, times w (inner, cols). One batch row i
// at a time, blocks of kRowBlock steps: dgx's rows of one batch row are b*inner apart, out's st0. Written in x's
// layout, the gradient needs no copy when autograd adds it to x's (a transposed one was cloned): fwd + bwd 1.00-1.02x
// at b 32, t 100, H 256, the GRU 1.02-1.05x at b 8, t 1024, H 40-52 (one and two threads, alternating in one process).
void brgemm_into_layout(const float* a, const float* w, float* out, int64_t T, int64_t B, int64_t inner,
                        int64_t cols, int64_t st0, int64_t st1) {
  const int64_t blocks = (T + kRowBlock - 1) / kRowBlock;
  at::parallel_for(0, B * blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t i = u / blocks, s0 = (u % blocks) * kRowBlock, m = std::min(kRowBlock, T - s0);
      at::native::cpublas::brgemm(m, cols, inner, B * inner, cols, st0, false, a + (s0 * B + i) * inner, w,
                                  out + i * st1 + s0 * st0);
    }
  });
}

// The weight gradients' products: out (n, G) = aT (n, rows) dg (rows, G), a sum over all t*b rows. The output's
// columns in shares of whole vectors over the threads (at least one share per thread and per 128 columns), the rows
// in chunks of kRowChunk accumulated by brgemm. Against MKL's dg^T a on the AMD EPYC, which runs at 75-94 GFLOP/s
// on one thread: (3200, 1024) and (3200, 128) 10.4 -> 8.4 ms, (8192, 160) and (8192, 40) 1.40 -> 0.91 ms; two
// threads 6.2 -> 4.3 and 0.86 -> 0.74 ms (brgemm as a probe, alternating in one process, before aT's transpose).
constexpr int64_t kRowChunk = 256;

void brgemm_weight_product(const float* aT, const float* dg, float* out, int64_t n, int64_t rows, int64_t G) {
  const int64_t threads = at::get_num_threads(), blocks = (G + 127) / 128;
  const int64_t parts = threads * ((blocks + threads - 1) / threads);
  at::parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t c0 = share_start(G, parts, p), c1 = share_start(G, parts, p + 1);
      for (int64_t k0 = 0; c1 > c0 && k0 < rows; k0 += kRowChunk)
        at::native::cpublas::brgemm(n, c1 - c0, std::min(kRowChunk, rows - k0), rows, G, G, k0 > 0, aT + k0,
                                    dg + k0 * G + c0, out + c0);
    }
  });
}
#else
void brgemm_into_layout(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
  TORCH_CHECK(false, "seqlab's recurrent kernel: brgemm products need an AVX-512 build with torch 2.13 or newer");
}

void brgemm_weight_product(const float*, const float*, float*, int64_t, int64_t, int64_t) {
  TORCH_CHECK(false, "seqlab's recurrent kernel: brgemm products need an AVX-512 build with torch 2.13 or newer");
}
#endif

// after a loop of brgemm steps: the micro-kernel's per-thread state, on each thread that ran it
void release_brgemm() {
#if SEQLAB_BRGEMM_STEPS
  at::parallel_for(0, at::get_num_threads(), 1, [](int64_t, int64_t) { at::native::cpublas::brgemm_release(); });
#endif
}

// Which way a call's steps multiply, for its scalar type and sizes: {small loops, brgemm}; neither: MKL
template <typename T>
std::pair<bool, bool> step_paths(int64_t B, int64_t H, int64_t G) {
  const bool brgemm = brgemm_steps<T>(), small = small_steps(B, H, G, brgemm);
  return {small, !small && brgemm};
}

// Whether this build multiplies tensors of x's dtype through brgemm (step_paths' choice, outside the dispatch)
bool brgemm_for(const at::Tensor& x) { return x.scalar_type() == at::kFloat && brgemm_steps<float>(); }

// Whether a whole-sequence float32 product of rows x inner x cols multiply-adds goes through brgemm_rows: from 2^25
// (below, at the RNN's b 8, t 1024, H 40 (13M), brgemm's blocks lost 0.93x on two threads, level on one)
bool brgemm_rows_for(const at::Tensor& x, int64_t rows, int64_t inner, int64_t cols) {
  return brgemm_for(x) && rows * inner * cols >= (int64_t(1) << 25);
}

// The previous state of step s (time-major out; the recurrence walks backwards in time when reverse).
at::Tensor previous(const at::Tensor& out, const at::Tensor& h0, int64_t s, bool reverse) {
  const int64_t first = reverse ? out.size(0) - 1 : 0;
  return s == first ? h0 : out[reverse ? s + 1 : s - 1];
}

// out (rows, cols) = a (rows, inner) w (inner, cols), all contiguous, by the way `paths` says ({small loops,
// brgemm}, neither: MKL): the projection's step products, h_s = m_s W_hrᵀ and dL/dm_s = dL/dh_s W_hr
template <typename T>
void step_product(const T* a, const T* w, T* out, int64_t rows, int64_t inner, int64_t cols, std::pair<bool, bool> paths,
                  const at::TensorOptions& options) {
  const T* none = nullptr;
  if (rows == 0) {
  } else if (paths.first) {
    small_product(a, w, none, out, rows, inner, cols, false);
  } else if (paths.second) {
    brgemm_product(a, w, none, out, rows, inner, cols, false);
  } else {
    at::Tensor o = at::from_blob(out, {rows, cols}, options);
    at::mm_out(o, at::from_blob(const_cast<T*>(a), {rows, inner}, options),
               at::from_blob(const_cast<T*>(w), {inner, cols}, options));
  }
}

}  // namespace

// x (t, b, in), h0 (b, R), the LSTM's c0 (b, H) -> {out (t, b, R), ws, x, ms}: ws is the GRU's saved gates
// (t, b, 4H) or the LSTM's gates and cell states (t, b, 5H; c_n is its last step's [4H, 5H) columns), empty for the
// RNN; x is the contiguous input that the backward needs (the argument itself when it already was); ms the
// projected LSTM's m_s (t, b, H), undefined without w_hr (P, H).
std::vector<at::Tensor> recurrent_forward(const at::Tensor& x_, const at::Tensor& h0_, const at::Tensor& w_ih,
                                          const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                          const std::optional<at::Tensor>& b_hh, int64_t mode, bool reverse,
                                          const std::optional<at::Tensor>& c0_,
                                          const std::optional<at::Tensor>& lengths,
                                          const std::optional<at::Tensor>& w_hr) {
  seqlab_vec::FlushDenormals flush;  // the gate loops run on this thread: subnormals flushed (vec_math.h)
  check(x_, h0_, w_ih, w_hh, b_ih, b_hh, mode, c0_, w_hr);
  const int64_t* lens = checked_lengths(lengths, x_.size(0), x_.size(1));
  const at::Tensor x = contiguous_buffer(x_), h0 = h0_.contiguous();
  const at::Tensor c0 = c0_.has_value() ? c0_->contiguous() : at::Tensor();
  const int64_t T = x.size(0), B = x.size(1), R = h0.size(1), G = w_hh.size(0), H = G / n_gates(mode);
  const int64_t W = saved_width(mode) * H;
  const bool gru = mode == kGru, lstm = mode == kLstm, has_bias = b_ih.has_value(), proj = w_hr.has_value();
  // (H, G), made row-major once: MKL's product against a transposed view ran at 0.73x the rate per step
  // (122 against 168 GFLOP/s for (32, 256) x (256, 256) on one thread of an Intel Xeon)
  const at::Tensor w_hh_t = w_hh.t().contiguous();
  // all steps' input projection at once; the RNN and the LSTM fold b_hh in here, the GRU keeps b_hn in r ⊙ (...)
  const at::Tensor x2 = x.view({T * B, x.size(2)});
  at::Tensor gx = scratch(kGx, {T * B, G}, x.options());  // (t*b, in) x (in, G) -> (t*b, G)
  const at::Tensor w_ih_t = w_ih.t().contiguous();  // (in, G), row-major for the same reason (126 -> 171 GFLOP/s)
  const at::Tensor b_in = has_bias ? (gru ? b_ih->contiguous() : b_ih->add(*b_hh)) : at::Tensor();
  if (brgemm_rows_for(x, T * B, x.size(2), G)) {
    const float* bias = has_bias ? b_in.data_ptr<float>() : nullptr;
    brgemm_rows<float>(x2.data_ptr<float>(), w_ih_t.data_ptr<float>(), bias, gx.data_ptr<float>(), T * B, x.size(2), G);
    release_brgemm();
  } else if (has_bias) {
    at::addmm_out(gx, b_in, x2, w_ih_t);
  } else {
    at::mm_out(gx, x2, w_ih_t);
  }
  gx = gx.view({T, B, G});
  at::Tensor out = buffer({T, B, R}, x.options());
  at::Tensor ws = buffer({W > 0 ? T : 0, B, std::max<int64_t>(W, 4 * H)}, x.options());
  at::Tensor ms = proj ? buffer({T, B, H}, x.options()) : at::Tensor();  // m_s, what the projection multiplies
  const at::Tensor w_hr_t = proj ? w_hr->t().contiguous() : at::Tensor();  // (H, P)
  at::Tensor gh = at::empty({B, G}, x.options());
  const at::Tensor b_step = gru && has_bias ? b_hh->contiguous() : at::Tensor();  // kept alive for its pointer
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "seqlab_recurrent_forward", [&] {
    // raw pointers for every buffer (contiguous and time-major); tensors only for MKL's products
    const scalar_t *h0p = h0.data_ptr<scalar_t>(), *gxp = gx.data_ptr<scalar_t>();
    const scalar_t* c0p = lstm ? c0.data_ptr<scalar_t>() : nullptr;
    const scalar_t* whh = w_hh_t.data_ptr<scalar_t>();
    const scalar_t* bias = b_step.defined() ? b_step.data_ptr<scalar_t>() : nullptr;
    scalar_t *outp = out.data_ptr<scalar_t>(), *ghp = gh.data_ptr<scalar_t>();
    scalar_t* msp = proj ? ms.data_ptr<scalar_t>() : nullptr;
    const scalar_t* whr = proj ? w_hr_t.data_ptr<scalar_t>() : nullptr;
    const auto [small, brg] = step_paths<scalar_t>(B, R, G);
    const auto proj_paths = step_paths<scalar_t>(B, H, R);
    for (int64_t k = 0; k < T; ++k) {
      const int64_t s = reverse ? T - 1 - k : k, A = active(lens, B, s);  // A: the step's real rows, a prefix
      const scalar_t* hps = k == 0 ? h0p : outp + (reverse ? s + 1 : s - 1) * B * R;
      scalar_t* hs = outp + s * B * R;
      scalar_t* mss = proj ? msp + s * B * H : hs;  // where the gate loop writes o ⊙ tanh(c)
      // W_hh h_{s-1} (+ b_hn): (A, R) x (R, G), into gh for the GRU and the LSTM, straight into out[s] for the RNN
      if (A == 0) {
      } else if (small) {
        small_product(hps, whh, bias, gru || lstm ? ghp : hs, A, R, G, false);
      } else if (brg) {
        brgemm_product(hps, whh, bias, gru || lstm ? ghp : hs, A, R, G, false);
      } else {
        const at::Tensor hp = previous(out, h0, s, reverse).narrow(0, 0, A);
        at::Tensor dst = (gru || lstm ? gh : out[s]).narrow(0, 0, A);
        if (bias) at::addmm_out(dst, *b_hh, hp, w_hh_t);
        else at::mm_out(dst, hp, w_hh_t);
      }
      scalar_t* wss = ws.data_ptr<scalar_t>() + s * B * W;
      const auto [cps, ci] = lstm ? previous_cell<scalar_t>(c0p, wss, k, reverse, B, H) : std::pair{hps, H};
      if (gru) {
        for (int64_t i = 0; i < A; ++i)
          gru_forward_row(gxp + (s * B + i) * G, ghp + i * G, hps + i * H, hs + i * H, wss + i * W, H);
      } else if (lstm) {
        for (int64_t i = 0; i < A; ++i)
          lstm_forward_row(gxp + (s * B + i) * G, ghp + i * G, cps + i * ci, mss + i * H, wss + i * W, H);
        if (proj) step_product(static_cast<const scalar_t*>(mss), whr, hs, A, H, R, proj_paths, x.options());
      } else {
        rnn_forward_row(hs, gxp + s * B * G, A * H, mode == kRelu);
      }
      for (int64_t i = A; i < B; ++i) {  // padding: the state held
        std::copy(hps + i * R, hps + (i + 1) * R, hs + i * R);
        if (lstm) std::copy(cps + i * ci, cps + i * ci + H, wss + i * W + 4 * H);
        if (proj) std::fill(mss + i * H, mss + (i + 1) * H, scalar_t(0));  // no dW_hr term from a held step
      }
    }
    if (brg || proj_paths.second) release_brgemm();
  });
  return {out, ws, x, ms};
}

namespace {

// total[j] += Σ_i rows[i, j] for the columns c0 <= j < G of a step's B rows: the bias gradients, summed while the
// rows are in cache (a sum over the whole (t*b, G) buffers afterwards read them from memory again: 1.5 ms of a
// GRU's 65 at b 32, t 100, H 256 on one thread). A step's rows add up in T, the steps in float64. Only beside
// the larger steps: with the small ones (small_steps) the per-step sums cost more than they save (the RNN at b 8,
// t 1024, H 40 0.98x on one thread, where the whole buffer is 1.3 MB).
template <typename T>
void add_rows(const T* rows, int64_t B, int64_t G, int64_t c0, T* part, double* total) {
  std::fill(part + c0, part + G, T(0));
  for (int64_t i = 0; i < B; ++i) {
    const T* r = rows + i * G;
#pragma omp simd
    for (int64_t j = c0; j < G; ++j) part[j] += r[j];
  }
  for (int64_t j = c0; j < G; ++j) total[j] += part[j];
}

// The reverse loop: fills dgx, dgh (t, b, G) and returns dL/dh0 (the LSTM's dc, dL/dc_n on entry, becomes
// dL/dc0); with sums (G,) float64 each, adds dgh's column sums into sums[0] and, for the GRU, the n gate's columns
// of dgx into sums[1] (its r and z columns equal dgh's). With a projection w_hr (P, H) it also fills dhs (t, b, P)
// with each step's dL/dh_s (zero at held steps), what dW_hr needs.
at::Tensor backward_loop(const at::Tensor& go, at::Tensor dh, at::Tensor& dc, const at::Tensor& h0,
                         const at::Tensor& c0, const at::Tensor& w_hh, const at::Tensor& out, const at::Tensor& ws,
                         at::Tensor& dgx, at::Tensor& dgh, int64_t mode, bool reverse, double* sums[2],
                         const int64_t* lens, const at::Tensor& w_hr, at::Tensor& dhs_all) {
  const int64_t T = out.size(0), B = out.size(1), R = out.size(2), G = w_hh.size(0), H = G / n_gates(mode);
  const int64_t W = saved_width(mode) * H;
  const bool gru = mode == kGru, lstm = mode == kLstm, proj = w_hr.defined();
  const at::Tensor w = w_hh.contiguous(), whr = proj ? w_hr.contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "seqlab_recurrent_backward", [&] {
    const scalar_t *outp = out.data_ptr<scalar_t>(), *h0p = h0.data_ptr<scalar_t>(), *wp = w.data_ptr<scalar_t>();
    scalar_t *dghp = dgh.data_ptr<scalar_t>(), *dgxp = dgx.data_ptr<scalar_t>();
    const scalar_t* none = nullptr;  // no bias in these products
    const auto [small, brg] = step_paths<scalar_t>(B, R, G);
    const auto proj_paths = step_paths<scalar_t>(B, H, R);
    std::vector<scalar_t> part(G);
    // the projection's dL/dm_s (b, H), and zeros: the gate loop's dL/dh from later steps, all in dL/dm_s already
    std::vector<scalar_t> dm(proj ? B * H : 0), zero(proj ? H : 0, scalar_t(0));
    const scalar_t* whrp = proj ? whr.data_ptr<scalar_t>() : nullptr;
    for (int64_t k = T - 1; k >= 0; --k) {
      // A: the step's real rows, a prefix; the held rows after it get no gate gradient (zeroed for the whole-sequence
      // products and sums after the loop) and keep their dL/dh, which the products below, of A rows, leave alone
      const int64_t s = reverse ? T - 1 - k : k, A = active(lens, B, s);
      // out, dgh, dgx, ws contiguous, time-major; the GRU's and the LSTM's go rows may lie apart (see the caller)
      const scalar_t* gos = go.data_ptr<scalar_t>() + s * go.stride(0);
      const int64_t gi = go.stride(1);
      scalar_t *dhs = dh.data_ptr<scalar_t>(), *dghs = dghp + s * B * G;
      const scalar_t* hps = k == 0 ? h0p : outp + (reverse ? s + 1 : s - 1) * B * R;
      if (gru) {
        const scalar_t* wss = ws.data_ptr<scalar_t>() + s * B * W;
        scalar_t* dgxs = dgxp + s * B * G;
        for (int64_t i = 0; i < A; ++i)
          gru_backward_row(gos + i * gi, wss + i * W, hps + i * H, dhs + i * H, dgxs + i * G, dghs + i * G, H);
        std::fill(dgxs + A * G, dgxs + B * G, scalar_t(0));
        std::fill(dghs + A * G, dghs + B * G, scalar_t(0));
        if (sums[0]) {
          add_rows(static_cast<const scalar_t*>(dghs), B, G, 0, part.data(), sums[0]);
          add_rows(static_cast<const scalar_t*>(dgxs), B, G, 2 * H, part.data(), sums[1]);
        }
        // dL/dh_{s-1} += dgh[s] W_hh: (A, 3H) x (3H, H) -> (A, H)
        if (A == 0) {
        } else if (small) small_product(static_cast<const scalar_t*>(dghs), wp, none, dhs, A, G, H, true);
        else if (brg) brgemm_product(static_cast<const scalar_t*>(dghs), wp, none, dhs, A, G, H, true);
        else dh.narrow(0, 0, A).addmm_(dgh[s].narrow(0, 0, A), w_hh);  // MKL
      } else if (lstm) {
        const scalar_t* wss = ws.data_ptr<scalar_t>() + s * B * W;
        const auto [cps, ci] = previous_cell<scalar_t>(c0.data_ptr<scalar_t>(), wss, k, reverse, B, H);
        scalar_t* dcs = dc.data_ptr<scalar_t>();
        if (proj) {  // dL/dh_s = dL/dout_s + dh (kept for dW_hr), then dL/dm_s = dL/dh_s W_hr: (A, P) x (P, H)
          scalar_t* drs = dhs_all.data_ptr<scalar_t>() + s * B * R;
          for (int64_t i = 0; i < A; ++i)
            for (int64_t j = 0; j < R; ++j) drs[i * R + j] = gos[i * gi + j] + dhs[i * R + j];
          std::fill(drs + A * R, drs + B * R, scalar_t(0));
          step_product(static_cast<const scalar_t*>(drs), whrp, dm.data(), A, R, H, proj_paths, out.options());
          for (int64_t i = 0; i < A; ++i)
            lstm_backward_row(static_cast<const scalar_t*>(dm.data() + i * H), wss + i * W, cps + i * ci,
                              zero.data(), dcs + i * H, dghs + i * G, H);
        } else {
          for (int64_t i = 0; i < A; ++i)
            lstm_backward_row(gos + i * gi, wss + i * W, cps + i * ci, static_cast<const scalar_t*>(dhs + i * H),
                              dcs + i * H, dghs + i * G, H);
        }
        std::fill(dghs + A * G, dghs + B * G, scalar_t(0));  // the held rows' dc passes unchanged
        if (sums[0]) add_rows(static_cast<const scalar_t*>(dghs), B, G, 0, part.data(), sums[0]);
        // dL/dh_{s-1} = dgates[s] W_hh: (A, 4H) x (4H, R) -> (A, R)
        if (A == 0) {
        } else if (small) small_product(static_cast<const scalar_t*>(dghs), wp, none, dhs, A, G, R, false);
        else if (brg) brgemm_product(static_cast<const scalar_t*>(dghs), wp, none, dhs, A, G, R, false);
        else mm_rows(dh, dgh[s], w_hh, A);
      } else {
        rnn_backward_row(gos, outp + s * B * H, dhs, dghs, A * H, mode == kRelu);  // go contiguous: one span
        std::fill(dghs + A * G, dghs + B * G, scalar_t(0));
        if (sums[0]) add_rows(static_cast<const scalar_t*>(dghs), B, G, 0, part.data(), sums[0]);
        // dL/dh_{s-1} = dpre[s] W_hh: (A, H) x (H, H) -> (A, H)
        if (A == 0) {
        } else if (small) small_product(static_cast<const scalar_t*>(dghs), wp, none, dhs, A, H, H, false);
        else if (brg) brgemm_product(static_cast<const scalar_t*>(dghs), wp, none, dhs, A, H, H, false);
        else mm_rows(dh, dgh[s], w_hh, A);
      }
    }
    if (brg || proj_paths.second) release_brgemm();
  });
  return dh;
}

#if defined(__AVX2__)
// dst's 8 rows (ldd apart) = src's 8 rows (lds apart) of 8 floats, transposed in registers: pairs interleaved
// (unpack), then pairs of pairs (shuffle), then the 128-bit halves (permute)
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// dst[c * ld + r] = src[r * cols + c]: src (rows, cols) transposed into the first rows columns of dst (cols, ld).
// Blocks of 8 rows; with AVX2 their whole 8 x 8 tiles go through registers (a scalar loop, strided on one side,
// took a third of what brgemm saved on the weight gradients), the edges element by element.
void transpose_into(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  at::parallel_for(0, (rows + 7) / 8, 32, [&](int64_t lo, int64_t hi) {
    for (int64_t rb = lo; rb < hi; ++rb) {
      const int64_t r0 = rb * 8, r1 = std::min(rows, r0 + 8);
      int64_t c0 = 0;
#if defined(__AVX2__)
      if (r1 - r0 == 8)
        for (; c0 + 8 <= cols; c0 += 8) transpose8x8(src + r0 * cols + c0, cols, dst + c0 * ld + r0, ld);
#endif
      for (int64_t c = c0; c < cols; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ld + r] = src[r * cols + c];
    }
  });
}

// A weight gradient dW (G, n) = Σ_r dg[r]^T a[r] over dg's rows (t*b, G), a's rows given as contiguous pieces in
// dg's row order; float32 through brgemm_weight_product, which reads both operands row-major: a^T (n, t*b) is made
// once (a is x or the previous states, narrower than dg's G gate columns in the usual layers), and the (n, G)
// result is transposed back.
at::Tensor weight_grad(const at::Tensor& dg, std::initializer_list<at::Tensor> pieces) {
  const int64_t rows = dg.size(0), G = dg.size(1), n = pieces.begin()->size(-1);
  at::Tensor aT = scratch(kT, {n, rows}, dg.options());
  int64_t r0 = 0;
  for (const at::Tensor& piece : pieces) {
    const int64_t m = piece.numel() / n;
    transpose_into(piece.data_ptr<float>(), m, n, aT.data_ptr<float>() + r0, rows);
    r0 += m;
  }
  TORCH_CHECK(r0 == rows, "weight_grad: the pieces hold ", r0, " rows, dg ", rows);
  at::Tensor dwT = at::empty({n, G}, dg.options());
  brgemm_weight_product(aT.data_ptr<float>(), dg.data_ptr<float>(), dwT.data_ptr<float>(), n, rows, G);
  release_brgemm();
  return dwT.t().contiguous();
}

}  // namespace

// -> {dx (t, b, in) or undefined, dh0 (b, R), dW_ih, dW_hh, db_ih, db_hh (undefined without bias), dc0 (the
// LSTM's; undefined for the others), dW_hr (the projected LSTM's; undefined without w_hr)}. dx_like: the input as the caller holds it (undefined: no dx wanted); through
// brgemm, dx takes its strides (a batch-first x's gradient then arrives contiguous), else dx is contiguous.
std::vector<at::Tensor> recurrent_backward(const std::optional<at::Tensor>& grad_out,
                                           const std::optional<at::Tensor>& grad_hn,
                                           const std::optional<at::Tensor>& grad_cn, const at::Tensor& x,
                                           const at::Tensor& h0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                           const at::Tensor& out, const at::Tensor& ws, int64_t mode, bool reverse,
                                           bool has_bias, const std::optional<at::Tensor>& dx_like,
                                           const std::optional<at::Tensor>& c0,
                                           const std::optional<at::Tensor>& lengths,
                                           const std::optional<at::Tensor>& w_hr,
                                           const std::optional<at::Tensor>& ms) {
  seqlab_vec::FlushDenormals flush;  // as in recurrent_forward
  check_backward(grad_out, grad_hn, grad_cn, x, h0, w_ih, w_hh, out, ws, mode, c0, w_hr, ms);
  const int64_t* lens = checked_lengths(lengths, out.size(0), out.size(1));
  const int64_t T = out.size(0), B = out.size(1), R = out.size(2), G = w_hh.size(0), H = G / n_gates(mode);
  const bool proj = w_hr.has_value();
  // dL/dout: the GRU's and the LSTM's gate loops run row by row and read the rows where they are (a batch-first
  // dL/dout needs no copy: 1% of the GRU's fwd + bwd at b 32, t 100, H 256); the RNN's runs over a step's b*H values
  // as one span, which a contiguous copy buys (row by row it lost 2% at b 8, H 40)
  const bool by_rows = mode == kGru || mode == kLstm;
  const bool rows_ok = grad_out.has_value() && grad_out->stride(2) == 1 && (by_rows || grad_out->is_contiguous());
  const at::Tensor go = !grad_out.has_value() ? at::zeros_like(out)
                        : rows_ok             ? *grad_out
                                              : contiguous_scratch(kGo, *grad_out);
  at::Tensor dh = grad_hn.has_value() ? grad_hn->contiguous().clone() : at::zeros({B, R}, out.options());
  at::Tensor dgh = scratch(kDgh, {T, B, G}, out.options());
  at::Tensor dgx = mode == kGru ? scratch(kDgx, {T, B, G}, out.options()) : dgh;  // the RNN's, the LSTM's: the same
  const bool fused_sums = has_bias && !small_steps(B, R, G, brgemm_for(out));
  at::Tensor bias_sums = at::zeros({fused_sums ? 2 : 0, G}, out.options().dtype(at::kDouble));
  double* sums[2] = {nullptr, nullptr};
  if (fused_sums) sums[0] = bias_sums.data_ptr<double>(), sums[1] = sums[0] + G;
  const bool lstm = mode == kLstm;
  at::Tensor dc = !lstm                ? at::Tensor()
                  : grad_cn.has_value() ? grad_cn->contiguous().clone()
                                        : at::zeros({B, H}, out.options());
  const at::Tensor c0c = lstm ? c0->contiguous() : at::Tensor();
  at::Tensor dhs_all = proj ? buffer({T, B, R}, out.options()) : at::Tensor();  // each step's dL/dh_s (P wide)
  const at::Tensor dh0 = backward_loop(go, dh, dc, h0.contiguous(), c0c, w_hh, out, ws, dgx, dgh, mode, reverse,
                                       sums, lens, proj ? *w_hr : at::Tensor(), dhs_all);
  // dW_hr = Σ_s dL/dh_sᵀ m_s: (P, t*b) x (t*b, H) -> (P, H)
  const at::Tensor dw_hr = proj ? dhs_all.view({T * B, R}).t().mm(ms->view({T * B, H})) : at::Tensor();
  // weight, bias and input gradients: one matmul (or sum) each over all t*b rows
  const at::Tensor dgx2 = dgx.view({T * B, G}), dgh2 = dgh.view({T * B, G});
  const at::Tensor x2 = x.contiguous().view({T * B, x.size(2)});
  const bool need_dx = dx_like.has_value() && dx_like->defined();
  const bool brg_dx = need_dx && brgemm_rows_for(x, T * B, G, x.size(2));
  // dx in x's own layout where brgemm writes it and that layout is dense with contiguous rows (a transposed view);
  // contiguous else (empty_like keeps the strides of a dense, non-overlapping tensor only)
  at::Tensor dx;
  if (brg_dx && !dx_like->is_contiguous() && dx_like->sizes() == x.sizes()) dx = at::empty_like(*dx_like);
  if (need_dx && (!dx.defined() || dx.stride(2) != 1)) dx = buffer({T, B, x.size(2)}, x.options());
  if (brg_dx) {  // (t*b, G) x (G, in) -> (t*b, in)
    const at::Tensor w = w_ih.contiguous();
    const float *a = dgx2.data_ptr<float>(), *wp = w.data_ptr<float>();
    if (dx.is_contiguous()) brgemm_rows<float>(a, wp, nullptr, dx.data_ptr<float>(), T * B, G, x.size(2));
    else brgemm_into_layout(a, wp, dx.data_ptr<float>(), T, B, G, x.size(2), dx.stride(0), dx.stride(1));
    release_brgemm();
  } else if (need_dx) {
    at::Tensor dx2 = dx.view({T * B, x.size(2)});
    at::mm_out(dx2, dgx2, w_ih);
  }
  // dW_ih = dgx^T x: (G, t*b) x (t*b, in) -> (G, in); dW_hh = sum_s dgh[s]^T h_{s-1}
  const bool brg_ih = brgemm_rows_for(x, T * B, x.size(2), G), brg_hh = brgemm_rows_for(x, T * B, R, G);
  at::Tensor dw_ih = brg_ih ? weight_grad(dgx2, {x2}) : dgx2.t().mm(x2);
  const int64_t first = reverse ? T - 1 : 0;
  const at::Tensor h0c = h0.contiguous();
  at::Tensor dw_hh;
  if (brg_hh) {  // h_{s-1} in dgh's row order: h0 then out[0, T-1) forwards, out[1, T) then h0 backwards
    if (T == 1) dw_hh = weight_grad(dgh2, {h0c});
    else if (reverse) dw_hh = weight_grad(dgh2, {out.slice(0, 1, T), h0c});
    else dw_hh = weight_grad(dgh2, {h0c, out.slice(0, 0, T - 1)});
  } else {  // the step that read h0, plus one matmul over all the others
    dw_hh = dgh[first].t().mm(h0c);
    if (T > 1) {
      const at::Tensor d = reverse ? dgh.slice(0, 0, T - 1) : dgh.slice(0, 1, T);
      const at::Tensor hp = reverse ? out.slice(0, 1, T) : out.slice(0, 0, T - 1);
      dw_hh.addmm_(d.reshape({-1, G}).t(), hp.reshape({-1, R}));  // (G, (t-1)*b) x ((t-1)*b, R) -> (G, R)
    }
  }
  at::Tensor db_ih, db_hh;
  if (has_bias) {
    if (fused_sums && mode == kGru) bias_sums[1].narrow(0, 0, 2 * H).copy_(bias_sums[0].narrow(0, 0, 2 * H));
    db_hh = fused_sums ? bias_sums[0].to(out.scalar_type()) : dgh2.sum(0);
    db_ih = mode != kGru ? db_hh.clone() : fused_sums ? bias_sums[1].to(out.scalar_type()) : dgx2.sum(0);
  }
  return {dx, dh0, dw_ih, dw_hh, db_ih, db_hh, dc, dw_hr};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("forward", &recurrent_forward,
        "one recurrent layer, one direction: x (t, b, in), h0 (b, R) (and the LSTM's c0 (b, H) and projection w_hr "
        "(P, H)) -> out, ws, x, ms",
        py::arg("x"), py::arg("h0"), py::arg("w_ih"), py::arg("w_hh"), py::arg("b_ih"), py::arg("b_hh"), py::arg("mode"),
        py::arg("reverse"), py::arg("c0"), py::arg("lengths"), py::arg("w_hr") = py::none());
  m.def("backward", &recurrent_backward, "gradients of forward, given dL/dout, dL/dh_n and the LSTM's dL/dc_n",
        py::arg("grad_out"), py::arg("grad_hn"), py::arg("grad_cn"), py::arg("x"), py::arg("h0"), py::arg("w_ih"),
        py::arg("w_hh"), py::arg("out"), py::arg("ws"), py::arg("mode"), py::arg("reverse"), py::arg("has_bias"),
        py::arg("dx_like"), py::arg("c0"), py::arg("lengths"), py::arg("w_hr") = py::none(),
        py::arg("ms") = py::none());
}
