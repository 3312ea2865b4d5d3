// surge::decode_attention: one new query token per sequence attends its keys straight from
// the paged KV cache (no gather of the context into a contiguous copy, no mask), float32,
// the (sequence, kv head) pairs split over torch's intra-op threads (at::parallel_for).
// vLLM's CPU build reads its paged cache the same way (PagedAttention, Kwon et al. SOSP'23 §4).
//
// q [B, H, D]; k_cache, v_cache [slots, KVH, D] (one layer; slot = page * page_size + i);
// pages [B, P] int64 (each sequence's page table, padded); lens [B] int64 (keys attended:
// positions 0 .. lens[b] - 1, the new token's included, already written); scale = D^-0.5.
// Out [B, H, D]. H = G * KVH: query head h reads kv head h / G (grouped-query attention).
// Softmax in float32 with the maximum subtracted (the same math as SDPA; sums in another
// order, so logits differ in the last bits). With AVX-512 and D a multiple of 16
// (`attend_one512`) the key rows are loaded once for the G query heads and the outputs summed
// in registers; measured with the C++ surge::packed_linear, one thread, 100mb preset:
// decode 1,113 -> 1,374 tok/s at batch 32, 794 -> 899 at 16 x 96 (docs/engine.md).

#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  float total = _mm_cvtss_f32(s);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// out[0:n] += w * x[0:n]
inline void axpy(float* out, const float* x, float w, int64_t n) {
  int64_t i = 0;
  __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(out + i)));
  }
  for (; i < n; ++i) out[i] += w * x[i];
}

// exp of 8 floats (Cephes' expf: 2^n by the exponent bits times a degree-6 polynomial on
// the remainder, ~1 ulp over the range softmax feeds it, x <= 0 after the maximum is
// subtracted). A scalar std::exp per score was most of a batch-8 step's attention.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// s[0:n] = exp(s[0:n] - mx); returns their sum.
inline float exp_shifted(float* s, int64_t n, float mx) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), m));
    _mm256_storeu_ps(s + t, v);
    acc = _mm256_add_ps(acc, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0.f;
  for (float v : lanes) sum += v;
  for (; t < n; ++t) {
    s[t] = std::exp(s[t] - mx);
    sum += s[t];
  }
  return sum;
}

// s[0:n] = exp(s[0:n] - max(s)): a softmax's numerators; returns 1 / their sum.
inline float exp_scores(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
  const float sum = exp_shifted(s, n, mx);
  return sum > 0.f ? 1.f / sum : 0.f;
}

const bool kHasAvx512 = __builtin_cpu_supports("avx512f");

// Keys (and values) are read a row of D floats per slot, KVH rows apart, from pages
// anywhere in the cache: a stride the hardware prefetchers follow poorly, and the weights
// streamed between two layers' attention have evicted the cache from L2. So each key's and
// value's row is prefetched `kAhead` keys before it is read (its 64-byte lines, the value's
// during the pass over keys); no arithmetic changes, so the sums are the same.
constexpr int64_t kAhead = 8;

inline void prefetch_row(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
  }
}

// One (sequence, kv head) with AVX-512, D a multiple of 16 (64 and 128 in practice): each
// key's row is loaded once for the G query heads that read it (q stays in L1), each score
// one horizontal sum; then each output vector of 64 floats is summed in registers over the
// keys, not read and written back per key. `offs` holds the n keys' row offsets (computed a
// page at a time, no division per key); `scores` room for G * n floats.
__attribute__((target("avx512f"))) void attend_one512(const float* qh, const float* kp,
                                                      const float* vp, const int64_t* offs,
                                                      int64_t n, int64_t G, int64_t D, float sc,
                                                      float* scores, float* oh) {
  const int64_t chunks = D / 16;
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = kp + offs[t];
    if (t + kAhead < n) {  // the value row too: the pass over values then finds it in cache
      prefetch_row(kp + offs[t + kAhead], D);
      prefetch_row(vp + offs[t + kAhead], D);
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = qh + g * D;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(kt));
      for (int64_t c = 1; c < chunks; ++c) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), _mm512_loadu_ps(kt + 16 * c), acc);
      }
      scores[g * n + t] = _mm512_reduce_add_ps(acc) * sc;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * n;
    const float inv = exp_scores(s, n);
    float* og = oh + g * D;
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
      const int64_t width = std::min<int64_t>(4, (D - c0) / 16);  // vectors of 16 this pass
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
      for (int64_t t = 0; t < n; ++t) {
        const float* vt = vp + offs[t] + c0;
        const __m512 w = _mm512_set1_ps(s[t]);
        for (int64_t i = 0; i < width; ++i) {
          acc[i] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vt + 16 * i), acc[i]);
        }
      }
      const __m512 scale = _mm512_set1_ps(inv);
      for (int64_t i = 0; i < width; ++i) {
        _mm512_storeu_ps(og + c0 + 16 * i, _mm512_mul_ps(acc[i], scale));
      }
    }
  }
}

// The same with AVX2 (any D): scores by `dot`, outputs by `axpy` per key.
void attend_one(const float* qh, const float* kp, const float* vp, const int64_t* offs,
                int64_t n, int64_t G, int64_t D, float sc, float* scores, float* oh) {
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = kp + offs[t];
    if (t + kAhead < n) prefetch_row(kp + offs[t + kAhead], D);
    for (int64_t g = 0; g < G; ++g) scores[g * n + t] = dot(qh + g * D, kt, D) * sc;
  }
  std::fill(oh, oh + G * D, 0.f);
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * n;
    const float inv = exp_scores(s, n);
    for (int64_t t = 0; t < n; ++t) s[t] *= inv;
  }
  for (int64_t t = 0; t < n; ++t) {
    const float* vt = vp + offs[t];
    if (t + kAhead < n) prefetch_row(vp + offs[t + kAhead], D);
    for (int64_t g = 0; g < G; ++g) axpy(oh + g * D, vt, scores[g * n + t], D);
  }
}

}  // namespace

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& pages_in,
                            const at::Tensor& lens_in, int64_t page_size, double scale) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "bad ranks");
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat,
              "decode_attention takes float32");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor pages = pages_in.to(at::kLong).contiguous();
  const at::Tensor lens = lens_in.to(at::kLong).contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(1), P = pages.size(1);
  TORCH_CHECK(k_cache.size(2) == D && H % KVH == 0 && pages.size(0) == B && lens.size(0) == B,
              "shapes do not match");
  const int64_t G = H / KVH;
  at::Tensor out = at::empty({B, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* pg = pages.data_ptr<int64_t>();
  const int64_t* ln = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const bool wide = kHasAvx512 && D % 16 == 0;
  at::parallel_for(0, B * KVH, 1, [&](int64_t w0, int64_t w1) {
    // Per thread, kept across calls: no allocation per (sequence, kv head).
    thread_local std::vector<float> scores;
    thread_local std::vector<int64_t> offs;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / KVH, kh = w % KVH;
      const int64_t n = std::min(ln[b], P * page_size);
      float* oh = op + (b * H + kh * G) * D;
      if (n <= 0) {
        std::fill(oh, oh + G * D, 0.f);
        continue;
      }
      if (static_cast<int64_t>(scores.size()) < G * n) scores.resize(G * n);
      if (static_cast<int64_t>(offs.size()) < n) offs.resize(n);
      for (int64_t t0 = 0, p = 0; t0 < n; t0 += page_size, ++p) {
        const int64_t base = (pg[b * P + p] * page_size * KVH + kh) * D;
        for (int64_t i = 0; i < page_size && t0 + i < n; ++i) offs[t0 + i] = base + i * KVH * D;
      }
      const float* qh = qp + (b * H + kh * G) * D;
      if (wide) {
        attend_one512(qh, kp, vp, offs.data(), n, G, D, sc, scores.data(), oh);
      } else {
        attend_one(qh, kp, vp, offs.data(), n, G, D, sc, scores.data(), oh);
      }
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def(
      "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor pages, Tensor lens, "
      "int page_size, float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(surge, CPU, m) { m.impl("decode_attention", &decode_attention); }
