// One decoding step of a pre-norm attention LM (GPT-2, Llama-style) in float32, the whole token in one call.
// Built on first use by seqlab/kernels/decode.py; seqlab/models/gpt_decode.py is its Python twin and its caller.
//
// Notation: b sequences, d model width, h query heads, g key/value heads (h/g query heads share one), k head
// size, f the MLP's hidden width, V the vocabulary, p the position being written, rows the output units of a
// projection. Per layer, with x (b, d) the residual stream:
//
//   y = norm1(x);  [q | k | v] = W_qkv y + b_qkv               q (b, h k), k and v (b, g k)
//   (RoPE on q and k);  K[p], V[p] = k, v                      the caches, (b, g, capacity, k)
//   o_i = softmax(q_i K[0..p]ᵀ · scale) V[0..p]                per query head i, against its key/value head
//   x += W_o o + b_o
//   y = norm2(x);  x += W_2 act(W_1 y + b_1) + b_2             (SwiGLU: W_2 (silu(W_g y) ⊙ W_u y))
//
// then logits = W_head norm(x) + b_head. At batch 1 every product is a matrix-vector product that streams its
// weights once, so decoding is bound by memory bandwidth; what costs time beyond that is everything between the
// products. Here the whole step is one OpenMP parallel region: each thread owns a fixed share of every weight
// matrix's rows (and of the attention heads), norms are recomputed by every thread into its own buffer, and the
// phases are separated by barriers (4 per layer) instead of one fork and join per operation. Generation loops
// in one call too, greedy (argmax) or sampled (temperature, top-k, top-p, and torch.multinomial's draws from the
// caller's generator), so a token costs no Python.
//
// Narrow includes rather than <torch/extension.h>: they halve the first build's time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <omp.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "vec_math.h"

namespace {

using seqlab_vec::exp_;
using seqlab_vec::gelu_tanh_;
using seqlab_vec::silu_;
using Opt = std::optional<at::Tensor>;

enum Act : int64_t { kRelu = 0, kGelu = 1, kGeluTanh = 2, kSilu = 3 };

const float* ptr(const Opt& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; }

inline float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y (b, d) = norm(x (b, d)): LayerNorm (biased variance, optional weight and bias) or RMSNorm
struct Norm {
  const float* w;
  const float* bias;
  float eps;
  bool rms;

  void apply(const float* __restrict__ x, float* __restrict__ y, int64_t b, int64_t d) const {
    for (int64_t r = 0; r < b; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      float mean = 0.0f;
      if (!rms) {
#pragma omp simd reduction(+ : mean)
        for (int64_t j = 0; j < d; ++j) mean += xr[j];
        mean /= float(d);
      }
      float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < d; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
      const float inv = 1.0f / std::sqrt(sq / float(d) + eps);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        const float v = (xr[j] - mean) * inv * (w ? w[j] : 1.0f);
        yr[j] = bias ? v + bias[j] : v;
      }
    }
  }
};

// A weight (rows, cols) with an optional bias; `into` computes rows [r0, r1) of W y + bias for b inputs.
struct Proj {
  const float* w;
  const float* bias;
  int64_t rows, cols;

  // out[i, r] (row stride ld) = or += (add) W[r] · y[i] + bias[r], for rows [r0, r1) and every input i < b,
  // in tiles of up to 4 rows x 4 inputs (see tile)
  void into(const float* y, float* out, int64_t ld, int64_t b, int64_t r0, int64_t r1, bool add) const {
    for (int64_t r = r0; r < r1; r += 4) {
      const int rows_here = static_cast<int>(std::min<int64_t>(4, r1 - r));
      for (int64_t i = 0; i < b; i += 4) {
        float sums[16];
        const int inputs = static_cast<int>(std::min<int64_t>(4, b - i));
        if (rows_here == 4) {
          switch (inputs) {
            case 1: tile<4, 1>(r, y + i * cols, sums); break;
            case 2: tile<4, 2>(r, y + i * cols, sums); break;
            case 3: tile<4, 3>(r, y + i * cols, sums); break;
            default: tile<4, 4>(r, y + i * cols, sums);
          }
        } else {
          for (int m = 0; m < rows_here; ++m)
            for (int q = 0; q < inputs; ++q) sums[m * inputs + q] = dot(w + (r + m) * cols, y + (i + q) * cols, cols);
        }
        for (int m = 0; m < rows_here; ++m)
          for (int q = 0; q < inputs; ++q) {
            const float v = sums[m * inputs + q] + (bias ? bias[r + m] : 0.0f);
            float& o = out[(i + q) * ld + r + m];
            o = add ? o + v : v;
          }
      }
    }
  }

  // sums[m I + q] = W[r + m] · y[q] for R rows and I inputs: R I accumulators of 16 lanes, each updated once per
  // 16 columns, so the vector adds do not wait on each other (one dot product alone is bound by the add's
  // latency, not by memory) and a weight row read once serves I inputs. A reduction over an array instead of
  // these explicit lanes is not vectorized by GCC (20x slower).
  template <int R, int I>
  void tile(int64_t r, const float* __restrict__ y, float* __restrict__ sums) const {
    constexpr int L = 16;
    float acc[R * I][L] = {};
    const float* __restrict__ wr = w + r * cols;
    const int64_t full = cols - cols % L;
    for (int64_t j0 = 0; j0 < full; j0 += L)
      for (int m = 0; m < R; ++m)
        for (int q = 0; q < I; ++q)
#pragma omp simd
          for (int l = 0; l < L; ++l) acc[m * I + q][l] += wr[m * cols + j0 + l] * y[q * cols + j0 + l];
    for (int m = 0; m < R; ++m)
      for (int q = 0; q < I; ++q) {
        float t = 0.0f;
        for (int l = 0; l < L; ++l) t += acc[m * I + q][l];
        for (int64_t j = full; j < cols; ++j) t += wr[m * cols + j] * y[q * cols + j];
        sums[m * I + q] = t;
      }
  }
};

struct Layer {
  Norm norm1, norm2;
  Proj qkv, out, fc1, up, fc2;  // up: SwiGLU's second input projection (fc1 is its gate); unused otherwise
  float* kcache;                // (b, g, capacity, k)
  float* vcache;
};

inline float activate(float v, int64_t act) {
  switch (act) {
    case kRelu:
      return v > 0.0f ? v : 0.0f;
    case kGelu:
      return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case kGeluTanh:
      return gelu_tanh_(v);
    default:
      return silu_(v);
  }
}

// [lo, hi) of n items for thread t of n_threads, in blocks of 8 so that threads do not share cache lines
inline void share(int64_t n, int t, int n_threads, int64_t& lo, int64_t& hi) {
  const int64_t blocks = (n + 7) / 8, per = (blocks + n_threads - 1) / n_threads;
  lo = std::min(n, t * per * 8);
  hi = std::min(n, (t + 1) * per * 8);
}

}  // namespace

class Decoder {
 public:
  // layers: per layer [norm1 w, norm1 b, qkv w, qkv b, out w, out b, norm2 w, norm2 b, fc1 w, fc1 b, up w, up b,
  //   fc2 w, fc2 b, k cache, v cache] (None where the model has no such tensor); globals: [embedding, position
  //   table, cos, sin, final norm w, final norm b, head w, head b]; sizes: [b, d, h, g, k, f, V, capacity,
  //   activation, swiglu, rms, rotary dim, interleaved, threads]; consts: [norm1 eps, norm2 eps, final eps, scale]
  Decoder(std::vector<std::vector<Opt>> layers, std::vector<Opt> globals, std::vector<int64_t> sizes,
          std::vector<double> consts)
      : keep_(std::move(layers)), globals_(std::move(globals)) {
    TORCH_CHECK(sizes.size() == 14 && consts.size() == 4 && globals_.size() == 8, "decoder: bad argument counts");
    b_ = sizes[0], d_ = sizes[1], h_ = sizes[2], g_ = sizes[3], k_ = sizes[4], f_ = sizes[5], vocab_ = sizes[6];
    capacity_ = sizes[7], act_ = sizes[8], swiglu_ = sizes[9] != 0, rotary_ = sizes[11], interleaved_ = sizes[12];
    threads_ = static_cast<int>(std::max<int64_t>(1, sizes[13]));
    const bool rms = sizes[10] != 0;
    scale_ = static_cast<float>(consts[3]);
    for (const auto& t : globals_)
      if (t.has_value()) check(*t);
    for (const auto& l : keep_) {
      TORCH_CHECK(l.size() == 16, "decoder: a layer needs 16 entries");
      for (const auto& t : l)
        if (t.has_value()) check(*t);
      const int64_t qkv_rows = (h_ + 2 * g_) * k_, cache = b_ * g_ * capacity_ * k_;
      const int64_t sizes_of[16] = {d_, d_, qkv_rows * d_, qkv_rows, d_ * h_ * k_, d_, d_, d_,
                                    f_ * d_, f_, f_ * d_, f_, d_ * f_, d_, cache, cache};
      for (int i = 0; i < 16; ++i)  // every pointer read below stays inside its tensor
        TORCH_CHECK(!l[i].has_value() || l[i]->numel() == sizes_of[i], "decoder: layer tensor ", i, " has ",
                    l[i].has_value() ? l[i]->numel() : 0, " elements, expected ", sizes_of[i]);
      TORCH_CHECK(l[2].has_value() && l[4].has_value() && l[8].has_value() && l[12].has_value() &&
                      l[14].has_value() && l[15].has_value() && (!swiglu_ || l[10].has_value()),
                  "decoder: a layer lacks a weight or a cache");
      layers_.push_back({Norm{ptr(l[0]), ptr(l[1]), float(consts[0]), rms},
                         Norm{ptr(l[6]), ptr(l[7]), float(consts[1]), rms},
                         Proj{ptr(l[2]), ptr(l[3]), qkv_rows, d_}, Proj{ptr(l[4]), ptr(l[5]), d_, h_ * k_},
                         Proj{ptr(l[8]), ptr(l[9]), f_, d_}, Proj{ptr(l[10]), ptr(l[11]), f_, d_},
                         Proj{ptr(l[12]), ptr(l[13]), d_, f_}, l[14]->data_ptr<float>(), l[15]->data_ptr<float>()});
    }
    TORCH_CHECK(globals_[0].has_value() && globals_[0]->dim() == 2 && globals_[0]->size(1) == d_ &&
                    globals_[6].has_value() && globals_[6]->numel() == vocab_ * d_,
                "decoder: the embedding must be (vocab, d) and the head (V, d)");
    TORCH_CHECK(!globals_[1].has_value() || globals_[1]->numel() >= capacity_ * d_,
                "decoder: the position table is shorter than the buffers");
    TORCH_CHECK(rotary_ == 0 || (globals_[2].has_value() && globals_[2]->numel() >= capacity_ * (rotary_ / 2) &&
                                 globals_[3].has_value() && globals_[3]->numel() >= capacity_ * (rotary_ / 2)),
                "decoder: RoPE needs cos and sin tables (capacity, rotary dim / 2)");
    final_ = Norm{ptr(globals_[4]), ptr(globals_[5]), float(consts[2]), rms};
    head_ = Proj{ptr(globals_[6]), ptr(globals_[7]), vocab_, d_};
    const auto opts = globals_[0]->options();
    x_ = at::empty({b_, d_}, opts);
    y_ = at::empty({threads_, b_, d_}, opts);  // each thread's normed copy of x
    qkv_ = at::empty({b_, (h_ + 2 * g_) * k_}, opts);
    o_ = at::empty({b_, h_ * k_}, opts);
    hid_ = at::empty({2, b_, f_}, opts);                     // the MLP's hidden units (and SwiGLU's up)
    work_ = at::empty({threads_, capacity_ + 3 * k_}, opts);  // per thread: scores, rotated q and k
  }

  // ids (b,) int64, the tokens at position `pos` -> logits (b, V)
  at::Tensor step(const at::Tensor& ids, int64_t pos) {
    const at::Tensor ids_c = check_ids(ids, pos, 1);  // kept alive while its pointer is read
    at::Tensor logits = at::empty({b_, vocab_}, x_.options());
    run(ids_c.data_ptr<int64_t>(), pos, logits.data_ptr<float>());
    return logits;
  }

  // greedy decoding in one call: feed ids (b,) at `pos`, take each row's most likely token (the first of equal
  // maxima, as torch.argmax does; NaN or +inf logits are an error, as in sample_next), feed it at the next
  // position, n times -> the n tokens (b, n) int64
  at::Tensor greedy(const at::Tensor& ids, int64_t pos, int64_t n) {
    TORCH_CHECK(n >= 0, "decoder: n must be >= 0, got ", n);
    at::Tensor current = check_ids(ids, pos, n).clone();
    at::Tensor tokens = at::empty({b_, n}, current.options());
    at::Tensor logits = at::empty({b_, vocab_}, x_.options());
    int64_t* cur = current.data_ptr<int64_t>();
    int64_t* out = tokens.data_ptr<int64_t>();
    const float* lg = logits.data_ptr<float>();
    for (int64_t s = 0; s < n; ++s) {
      run(cur, pos + s, logits.data_ptr<float>());
      for (int64_t i = 0; i < b_; ++i) {
        const float* row = lg + i * vocab_;
        const float top = finite_top(row);
        int64_t best = 0;
        while (row[best] != top) ++best;  // the first of the maxima
        cur[i] = out[i * n + s] = best;
      }
      check_fed_back(cur);
    }
    return tokens;
  }

  // sampled decoding in one call: feed ids (b,) at `pos`, then n times draw each row's next token as
  // seqlab.models.generation.sample_next does (temperature, then top-k, then top-p) and feed it at the next
  // position -> the n tokens (b, n) int64. The randomness is torch.multinomial's for one sample, drawn from
  // `generator` (torch's default when None) in the same order: Exp(1) noise q (b, V) per step and the token
  // argmax(probs / q), so a seed gives the tokens that stepping with sample_next gives (up to float rounding of
  // the probabilities, which can only break a near tie another way)
  at::Tensor sample(const at::Tensor& ids, int64_t pos, int64_t n, double temperature, int64_t top_k, double top_p,
                    std::optional<at::Generator> generator) {
    TORCH_CHECK(n >= 0, "decoder: n must be >= 0, got ", n);
    TORCH_CHECK(temperature > 0, "decoder: sampling needs a temperature > 0 (0 is greedy), got ", temperature);
    TORCH_CHECK(top_k >= 0 && top_p > 0 && top_p <= 1,
                "decoder: top_k must be >= 0 (0: all) and top_p in (0, 1], got ", top_k, " and ", top_p);
    at::Tensor current = check_ids(ids, pos, n).clone();
    at::Tensor tokens = at::empty({b_, n}, current.options());
    at::Tensor logits = at::empty({b_, vocab_}, x_.options());
    at::Tensor noise = at::empty({b_, vocab_}, x_.options());
    int64_t* cur = current.data_ptr<int64_t>();
    int64_t* out = tokens.data_ptr<int64_t>();
    const float* lg = logits.data_ptr<float>();
    std::vector<float> z(vocab_), scratch(vocab_);
    std::vector<int64_t> order(vocab_);
    for (int64_t s = 0; s < n; ++s) {
      run(cur, pos + s, logits.data_ptr<float>());
      noise.exponential_(1.0, generator);
      const float* q = noise.data_ptr<float>();
      for (int64_t i = 0; i < b_; ++i)
        cur[i] = out[i * n + s] =
            pick(lg + i * vocab_, q + i * vocab_, float(temperature), top_k, top_p, z, scratch, order);
      check_fed_back(cur);
    }
    return tokens;
  }

 private:
  // one row's token: z = (logits - max) / temperature; top-k keeps z >= the k-th largest (ties kept); top-p keeps, in
  // order of z (stable), the tokens whose probability mass before them is < top_p; then argmax(softmax(z) / q)
  int64_t pick(const float* row, const float* q, float temperature, int64_t top_k, double top_p,
               std::vector<float>& z, std::vector<float>& scratch, std::vector<int64_t>& order) const {
    const float neg_inf = -INFINITY;
    const int64_t V = vocab_;
    const float mx = finite_top(row);
    for (int64_t v = 0; v < V; ++v) z[v] = (row[v] - mx) / temperature;  // the top at 0: no overflow at any T
    if (top_k > 0 && top_k < V) {
      std::copy(z.begin(), z.end(), scratch.begin());
      std::nth_element(scratch.begin(), scratch.begin() + (top_k - 1), scratch.end(), std::greater<float>());
      const float kth = scratch[top_k - 1];
      for (int64_t v = 0; v < V; ++v)
        if (z[v] < kth) z[v] = neg_inf;
    }
    if (top_p < 1.0) {  // (z's largest is 0 after the shift)
      int64_t kept = 0;
      for (int64_t v = 0; v < V; ++v)
        if (z[v] > neg_inf) order[kept++] = v;
      std::stable_sort(order.begin(), order.begin() + kept, [&](int64_t a, int64_t c) { return z[a] > z[c]; });
      double total = 0.0;
      for (int64_t j = 0; j < kept; ++j) total += std::exp(double(z[order[j]]));
      double before = 0.0;  // the mass of the tokens ranked above, the top token's 0: it is always kept
      for (int64_t j = 0; j < kept; ++j) {
        const double e = std::exp(double(z[order[j]]));
        if (before / total >= top_p) z[order[j]] = neg_inf;
        before += e;
      }
    }
    float total = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      z[v] = z[v] > neg_inf ? exp_(z[v]) : 0.0f;
      total += z[v];
    }
    const float inv = 1.0f / total;
    int64_t best = 0;
    float best_ratio = -1.0f;
    for (int64_t v = 0; v < V; ++v) {
      const float ratio = (z[v] * inv) / q[v];
      if (ratio > best_ratio) best = v, best_ratio = ratio;
    }
    return best;
  }

  // a row's largest logit, after checking that none is NaN or +inf and not all are -inf (sample_next's check)
  float finite_top(const float* row) const {
    float mx = -INFINITY;
    bool nan = false;
    for (int64_t v = 0; v < vocab_; ++v) nan |= std::isnan(row[v]), mx = std::max(mx, row[v]);
    TORCH_CHECK(!nan && std::isfinite(mx), "decoder: the logits hold NaN or +inf, or a row is all -inf (a diverged "
                "model?): there is no token to pick");
    return mx;
  }

  // the tokens a loop feeds back are rows of the head (V of them): each must be a row of the embedding too
  void check_fed_back(const int64_t* ids) const {
    for (int64_t i = 0; i < b_; ++i)
      TORCH_CHECK(ids[i] < globals_[0]->size(0), "decoder: drew token ", ids[i], ", which the embedding of ",
                  globals_[0]->size(0), " rows cannot read back");
  }

  at::Tensor check_ids(const at::Tensor& ids, int64_t pos, int64_t steps) const {
    TORCH_CHECK(ids.dim() == 1 && ids.size(0) == b_ && ids.scalar_type() == at::kLong,
                "decoder: expected ids of shape (", b_, ",) int64, got ", ids.sizes(), " ", ids.scalar_type());
    TORCH_CHECK(pos >= 0 && pos + std::max<int64_t>(steps, 1) <= capacity_, "decoder: positions ", pos, " to ",
                pos + std::max<int64_t>(steps, 1) - 1, " do not fit the buffers' ", capacity_);
    at::Tensor c = ids.contiguous();
    const int64_t* id = c.data_ptr<int64_t>();
    for (int64_t i = 0; i < b_; ++i)
      TORCH_CHECK(id[i] >= 0 && id[i] < globals_[0]->size(0), "decoder: token id ", id[i], " is not in [0, ",
                  globals_[0]->size(0), ")");
    return c;
  }

  // one step: tokens id (b,) at position pos -> logits lg (b, V)
  void run(const int64_t* id, int64_t pos, float* lg) {
    const float* table = globals_[0]->data_ptr<float>();
    const float* pos_table = ptr(globals_[1]);
    float* x = x_.data_ptr<float>();
    for (int64_t i = 0; i < b_; ++i)
      for (int64_t j = 0; j < d_; ++j)
        x[i * d_ + j] = table[id[i] * d_ + j] + (pos_table ? pos_table[pos * d_ + j] : 0.0f);
#pragma omp parallel num_threads(threads_)
    {
      seqlab_vec::FlushDenormals flush;  // this thread: subnormals flushed (vec_math.h)
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
      float* y = y_.data_ptr<float>() + t * b_ * d_;
      for (const Layer& layer : layers_) layer_step(layer, pos, x, y, t, n);
      final_.apply(x, y, b_, d_);
      int64_t lo, hi;
      share(vocab_, t, n, lo, hi);
      head_.into(y, lg, vocab_, b_, lo, hi, false);
    }
  }

  void layer_step(const Layer& L, int64_t pos, float* x, float* y, int t, int n) {
    float* qkv = qkv_.data_ptr<float>();
    float* o = o_.data_ptr<float>();
    float* hid = hid_.data_ptr<float>();
    const int64_t qkv_rows = L.qkv.rows;
    int64_t lo, hi;
    L.norm1.apply(x, y, b_, d_);
    share(qkv_rows, t, n, lo, hi);
    L.qkv.into(y, qkv, qkv_rows, b_, lo, hi, false);
#pragma omp barrier
    lo = t * b_ * h_ / n, hi = (t + 1) * b_ * h_ / n;  // attention: an even share of the (sequence, head) pairs
    for (int64_t u = lo; u < hi; ++u) attend(L, u / h_, u % h_, pos, qkv + (u / h_) * qkv_rows, o, t);
#pragma omp barrier
    share(d_, t, n, lo, hi);
    L.out.into(o, x, d_, b_, lo, hi, true);  // x += W_o o + b_o
#pragma omp barrier
    L.norm2.apply(x, y, b_, d_);
    share(f_, t, n, lo, hi);
    L.fc1.into(y, hid, f_, b_, lo, hi, false);
    if (swiglu_) L.up.into(y, hid + b_ * f_, f_, b_, lo, hi, false);
    for (int64_t i = 0; i < b_; ++i) {
      float* hr = hid + i * f_;
      const float* ur = hid + (b_ + i) * f_;
      if (swiglu_) {
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) hr[j] = silu_(hr[j]) * ur[j];
      } else if (act_ == kGelu) {
        for (int64_t j = lo; j < hi; ++j) hr[j] = activate(hr[j], kGelu);  // erf: the C library's, scalar
      } else {
        const int64_t act = act_;
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) hr[j] = activate(hr[j], act);
      }
    }
#pragma omp barrier
    share(d_, t, n, lo, hi);
    L.fc2.into(hid, x, d_, b_, lo, hi, true);  // x += W_2 hid + b_2
#pragma omp barrier
  }

  // RoPE on one head vector (k,), in place: pairs (i, i + r/2), or (2i, 2i + 1) when interleaved
  void rotate(float* v, int64_t pos) const {
    const int64_t half = rotary_ / 2;
    const float* cos = globals_[2]->data_ptr<float>() + pos * half;
    const float* sin = globals_[3]->data_ptr<float>() + pos * half;
    for (int64_t i = 0; i < half; ++i) {
      float& a = v[interleaved_ ? 2 * i : i];
      float& c = v[interleaved_ ? 2 * i + 1 : i + half];
      const float a2 = a * cos[i] - c * sin[i], c2 = c * cos[i] + a * sin[i];
      a = a2, c = c2;
    }
  }

  // query head `head` of sequence `seq`: write its key and value at `pos` (the group's first head does), then
  // o = softmax(q K[0..pos]ᵀ scale) V[0..pos] into o (b, h k)
  void attend(const Layer& L, int64_t seq, int64_t head, int64_t pos, const float* row, float* o, int t) {
    const int64_t group = head / (h_ / g_), k = k_;
    float* scores = work_.data_ptr<float>() + t * (capacity_ + 3 * k);
    float* q = scores + capacity_;
    float* key = q + k;
    std::copy(row + head * k, row + (head + 1) * k, q);
    std::copy(row + (h_ + group) * k, row + (h_ + group + 1) * k, key);
    const float* value = row + (h_ + g_ + group) * k;
    if (rotary_ > 0) rotate(q, pos), rotate(key, pos);
    const int64_t base = (seq * g_ + group) * capacity_ * k;
    const float* kc = L.kcache + base;
    const float* vc = L.vcache + base;
    if (head % (h_ / g_) == 0) {
      std::copy(key, key + k, L.kcache + base + pos * k);
      std::copy(value, value + k, L.vcache + base + pos * k);
    }
    // scores against the cached positions as one matrix-vector product (the cache's rows are positions), then
    // the current position against the key computed here (another head of the group may not have written it)
    Proj{kc, nullptr, pos, k}.into(q, scores, pos, 1, 0, pos, false);
    scores[pos] = dot(q, key, k);
    float top = -INFINITY;
    for (int64_t p = 0; p <= pos; ++p) top = std::max(top, scores[p] * scale_);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t p = 0; p <= pos; ++p) {
      scores[p] = exp_(scores[p] * scale_ - top);
      total += scores[p];
    }
    // o = Σ_p a_p V[p], 64 columns at a time in registers, positions in pairs (two independent chains of adds)
    float* out = o + seq * h_ * k + head * k;
    const float inv = 1.0f / total;
    for (int64_t j0 = 0; j0 < k; j0 += 64) {
      const int64_t width = std::min<int64_t>(64, k - j0);
      float even[64] = {}, odd[64] = {};
      int64_t p = 0;
      for (; p + 1 < pos; p += 2) {
        const float a0 = scores[p], a1 = scores[p + 1];
        const float* v0 = vc + p * k + j0;
        const float* v1 = v0 + k;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) even[j] += a0 * v0[j], odd[j] += a1 * v1[j];
      }
      for (; p <= pos; ++p) {
        const float a = scores[p];
        const float* vp = (p == pos ? value : vc + p * k) + j0;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) even[j] += a * vp[j];
      }
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) out[j0 + j] = (even[j] + odd[j]) * inv;
    }
  }

  static void check(const at::Tensor& t) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
                "decoder: every tensor must be a contiguous float32 CPU tensor, got ", t.scalar_type(), " ",
                t.sizes());
  }

  std::vector<std::vector<Opt>> keep_;  // the tensors the raw pointers below point into
  std::vector<Opt> globals_;
  std::vector<Layer> layers_;
  Norm final_{};
  Proj head_{};
  at::Tensor x_, y_, qkv_, o_, hid_, work_;
  int64_t b_, d_, h_, g_, k_, f_, vocab_, capacity_, act_, rotary_, interleaved_;
  bool swiglu_;
  int threads_;
  float scale_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Decoder>(m, "Decoder")
      .def(pybind11::init<std::vector<std::vector<Opt>>, std::vector<Opt>, std::vector<int64_t>,
                          std::vector<double>>())
      .def("step", &Decoder::step, "ids (b,) at position pos -> logits (b, V)", pybind11::arg("ids"),
           pybind11::arg("pos"))
      .def("greedy", &Decoder::greedy, "feed ids (b,) at pos, then n greedy steps -> tokens (b, n)",
           pybind11::arg("ids"), pybind11::arg("pos"), pybind11::arg("n"))
      .def("sample", &Decoder::sample,
           "feed ids (b,) at pos, then n sampled steps (sample_next's law and torch.multinomial's draws) -> tokens "
           "(b, n)",
           pybind11::arg("ids"), pybind11::arg("pos"), pybind11::arg("n"), pybind11::arg("temperature"),
           pybind11::arg("top_k"), pybind11::arg("top_p"), pybind11::arg("generator"));
}
