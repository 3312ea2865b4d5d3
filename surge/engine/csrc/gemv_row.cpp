// Decode projection y = x @ Wt of 1-8 rows on CPU (AVX2 + FMA, AVX-512 where present),
// float32, on torch's intra-op threads (at::parallel_for: the library is built with OpenMP
// and shares torch's runtime; built without it, at::parallel_for ran serially).
//
// Wt is the stored [in, out] layout of a projection (rows of `out` floats, row stride `ld`:
// a column slice of a fused q|k|v or gate|up keeps its parent's stride). The output rows are
// done in chunks of kChunkFloats / M columns (32 KB: stays in L1); for each chunk, eight rows
// of Wt at a time are folded into it, each weight vector loaded serving every input row, and
// for a batch each row prefetched a page ahead. Threads split the weight's rows in fixed
// blocks (partial sums added in block order), or, for the wide head, its columns: either way
// the sums do not depend on the thread count. Measured (strict quiet-run, 2026-11-28 07:38, SmolLM2's
// projections in step order, 538 MB, best of 6): at 2 threads 31.8 GB/s at one row where
// MKL's gemv reads 30.2, and 16.5 GB/s at eight rows where MKL's sgemm reads 12.4. Sums run
// in another order than MKL's, so results differ in the last bits (relative ~1e-6).
#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kRows = 8;
// Output floats a column chunk holds over its M rows (32 KB: stays in L1 beside the streams).
constexpr int64_t kChunkFloats = 8192;
// From this many columns on (the vocabulary's head) threads split the columns, in tiles of
// kTile, instead of the rows.
constexpr int64_t kWideColumns = 16384;
constexpr int64_t kTile = 64;
// How far ahead along a row the AVX-512 loop prefetches for a batch (2-8 rows): 4 KB, a page
// (the hardware prefetchers stop at page boundaries). Measured on SmolLM2's projections in
// step order (strict quiet-run, best of 6 passes): 8 rows at 2 threads 32.5 ms with it, 34.4
// without, 2 KB ahead 32.8; one row at 2 threads 16.9 / 17.7 / 18.7 ms but medians 21.4 /
// 20.8 / 21.5 (a wash), and at one thread 30.2 with it against 28.4 without: one row skips it.
constexpr int64_t kPrefetchFloats = 1024;
// Below this many weight floats (256 KB) one thread does the whole call: waking a second
// costs more than it saves.
constexpr int64_t kMinParallelFloats = 64 * 1024;
// Row blocks of a larger call: a fixed count, so the sums do not depend on the thread count,
// and 12 divides evenly over 1, 2, 3, 4 and 6 threads.
constexpr int64_t kBlocks = 12;
// Columns of the partials' sum one thread takes at least (below it, one thread adds them).
constexpr int64_t kMinReduceColumns = 8192;
// Input rows one call takes (a decode batch of up to 8): M accumulators fit the registers.
constexpr int64_t kMaxInputRows = 8;

void fold_rows(const float* rows, int64_t ld, const float* xs, int64_t nrows, float* y,
               int64_t j0, int64_t j1) {
  __m256 c[kRows];
  for (int64_t i = 0; i < nrows; i++) c[i] = _mm256_set1_ps(xs[i]);
  int64_t j = j0;
  if (nrows == kRows) {
    for (; j + 16 <= j1; j += 16) {
      __m256 a = _mm256_loadu_ps(y + j);
      __m256 b = _mm256_loadu_ps(y + j + 8);
      for (int64_t i = 0; i < kRows; i++) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(rows + i * ld + j), c[i], a);
        b = _mm256_fmadd_ps(_mm256_loadu_ps(rows + i * ld + j + 8), c[i], b);
      }
      _mm256_storeu_ps(y + j, a);
      _mm256_storeu_ps(y + j + 8, b);
    }
  }
  for (; j + 8 <= j1; j += 8) {
    __m256 acc = _mm256_loadu_ps(y + j);
    for (int64_t i = 0; i < nrows; i++) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(rows + i * ld + j), c[i], acc);
    }
    _mm256_storeu_ps(y + j, acc);
  }
  for (; j < j1; j++) {
    float s = y[j];
    for (int64_t i = 0; i < nrows; i++) s += rows[i * ld + j] * xs[i];
    y[j] = s;
  }
}

// fold_rows for M > 1 input rows at once (a small decode batch): each weight vector loaded
// is used by all M rows, so the weight streams once per call, not once per row. xt holds
// the M inputs transposed ([row of Wt][M]: the M values one weight row multiplies sit
// together), y is M output rows of stride ldy. Eight columns per iteration, M accumulators.
template <int M>
void fold_rows_m(const float* rows, int64_t ld, const float* xt, int64_t nrows, float* y,
                 int64_t ldy, int64_t j0, int64_t j1) {
  int64_t j = j0;
  for (; j + 8 <= j1; j += 8) {
    __m256 acc[M];
    for (int m = 0; m < M; m++) acc[m] = _mm256_loadu_ps(y + m * ldy + j);
    for (int64_t i = 0; i < nrows; i++) {
      const __m256 w = _mm256_loadu_ps(rows + i * ld + j);
      for (int m = 0; m < M; m++) {
        acc[m] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(xt + i * M + m), acc[m]);
      }
    }
    for (int m = 0; m < M; m++) _mm256_storeu_ps(y + m * ldy + j, acc[m]);
  }
  for (; j < j1; j++) {
    for (int m = 0; m < M; m++) {
      float s = y[m * ldy + j];
      for (int64_t i = 0; i < nrows; i++) s += rows[i * ld + j] * xt[i * M + m];
      y[m * ldy + j] = s;
    }
  }
}

// fold_rows_m with AVX-512 (where the CPU has it, `kHasAvx512`): 32 columns per iteration,
// two accumulators per input row (2 * M of the 32 registers), each weight row's values
// broadcast straight from memory into the FMAs. With AVX2's 16 registers the M = 8 case has
// one vector of columns per iteration and a broadcast per FMA. Columns left over (fewer
// than 32) go to the AVX2 loop. Also the one-row case (M = 1: xt is x itself).
template <int M>
__attribute__((target("avx512f"))) void fold_rows_m512(const float* rows, int64_t ld,
                                                       const float* xt, int64_t nrows, float* y,
                                                       int64_t ldy, int64_t j0, int64_t j1) {
  int64_t j = j0;
  for (; j + 32 <= j1; j += 32) {
    __m512 a[M], b[M];
    for (int m = 0; m < M; m++) {
      a[m] = _mm512_loadu_ps(y + m * ldy + j);
      b[m] = _mm512_loadu_ps(y + m * ldy + j + 16);
    }
    for (int64_t i = 0; i < nrows; i++) {
      const __m512 wa = _mm512_loadu_ps(rows + i * ld + j);
      const __m512 wb = _mm512_loadu_ps(rows + i * ld + j + 16);
      if constexpr (M > 1) {  // the same row a page ahead (see kPrefetchFloats)
        const char* ahead = reinterpret_cast<const char*>(rows + i * ld + j + kPrefetchFloats);
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
      }
      for (int m = 0; m < M; m++) {
        const __m512 c = _mm512_set1_ps(xt[i * M + m]);
        a[m] = _mm512_fmadd_ps(wa, c, a[m]);
        b[m] = _mm512_fmadd_ps(wb, c, b[m]);
      }
    }
    for (int m = 0; m < M; m++) {
      _mm512_storeu_ps(y + m * ldy + j, a[m]);
      _mm512_storeu_ps(y + m * ldy + j + 16, b[m]);
    }
  }
  if (j < j1) {
    if constexpr (M == 1) {
      fold_rows(rows, ld, xt, nrows, y, j, j1);
    } else {
      fold_rows_m<M>(rows, ld, xt, nrows, y, ldy, j, j1);
    }
  }
}

const bool kHasAvx512 = __builtin_cpu_supports("avx512f");

// The rows of Wt in [r0, r1) and its columns in [c0, c1), folded into the M output rows y
// (stride ldy), a chunk of columns at a time: the single-threaded kernel over one block. x is
// the one input row (M == 1) or the M inputs transposed (`fold_rows_m`).
template <int M>
void fold_block(const float* w, int64_t ld, const float* x, int64_t r0, int64_t r1, int64_t c0,
                int64_t c1, float* y, int64_t ldy) {
  // M output chunks of kChunkFloats / M floats stay in L1 together while the rows stream.
  constexpr int64_t chunk = kChunkFloats / M;
  for (int64_t j0 = c0; j0 < c1; j0 += chunk) {
    const int64_t j1 = std::min(c1, j0 + chunk);
    // The block is this chunk's only writer: it zeroes the chunk where it is about to sum
    // into it (in cache, on its own thread), not the caller the whole output beforehand.
    for (int m = 0; m < M; m++) std::fill(y + m * ldy + j0, y + m * ldy + j1, 0.0f);
    for (int64_t r = r0; r < r1; r += kRows) {
      const int64_t nrows = std::min(kRows, r1 - r);
      if (kHasAvx512) {
        fold_rows_m512<M>(w + r * ld, ld, x + r * M, nrows, y, ldy, j0, j1);
      } else if constexpr (M == 1) {
        fold_rows(w + r * ld, ld, x + r, nrows, y, j0, j1);
      } else {
        fold_rows_m<M>(w + r * ld, ld, x + r * M, nrows, y, ldy, j0, j1);
      }
    }
  }
}

// y [M, n] = x [M, k] @ Wt, x given as fold_block<M> takes it, on torch's intra-op threads
// (see gemv_row). The split depends on the shape only, never on the thread count, so the sums
// do not either.
template <int M>
void gemv_rows(const float* w, int64_t ld, const float* x, int64_t k, int64_t n, float* y) {
  if (k * n < kMinParallelFloats || k <= kRows) {
    fold_block<M>(w, ld, x, 0, k, 0, n, y, n);
    return;
  }
  if (n >= kWideColumns) {
    // A wide matrix (the vocabulary's head): each thread takes a contiguous range of
    // columns over every row, so every output sums its rows in one order, and no partials.
    at::parallel_for(0, (n + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
      fold_block<M>(w, ld, x, 0, k, t0 * kTile, std::min(n, t1 * kTile), y, n);
    });
    return;
  }
  const int64_t per_block = ((k + kBlocks - 1) / kBlocks + kRows - 1) / kRows * kRows;
  const int64_t blocks = (k + per_block - 1) / per_block;
  // The partials live in a buffer kept per calling thread, not a tensor per call: a buffer
  // over malloc's mmap threshold (128 KB) was mapped, faulted in and unmapped on every call,
  // and an unmap stops the other threads for a TLB shootdown. Each block zeroes its own
  // partial rows (`fold_block`), on the thread that fills them.
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(blocks * M * n)) buffer.resize(blocks * M * n);
  float* p = buffer.data();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
      float* part = p + b * M * n;
      fold_block<M>(w, ld, x, b * per_block, std::min(k, (b + 1) * per_block), 0, n, part, n);
    }
  });
  at::parallel_for(0, M * n, kMinReduceColumns, [&](int64_t j0, int64_t j1) {
    std::copy(p + j0, p + j1, y + j0);
    for (int64_t b = 1; b < blocks; b++) {
      const float* row = p + b * M * n;
      for (int64_t j = j0; j < j1; j++) y[j] += row[j];
    }
  });
}

}  // namespace

torch::Tensor gemv_row(torch::Tensor x, torch::Tensor wt) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && wt.dtype() == torch::kFloat32,
              "gemv_row: float32 only");
  TORCH_CHECK(wt.dim() == 2 && wt.stride(1) == 1,
              "gemv_row: wt must be [in, out] with unit column stride");
  const int64_t k = wt.size(0), n = wt.size(1), ld = wt.stride(0);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == k, "gemv_row: x's last dimension is not ", k);
  const int64_t m = k > 0 ? x.numel() / k : 0;
  TORCH_CHECK(m >= 1 && m <= kMaxInputRows, "gemv_row: 1 to ", kMaxInputRows,
              " input rows, not ", m);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  auto y = torch::empty(shape, x.options());  // every output is written (`fold_block`)
  const float* w = wt.data_ptr<float>();
  float* out = y.data_ptr<float>();
  // Threads split the weight's rows (the input), not its columns: each streams whole
  // contiguous rows of Wt, which the prefetchers follow; a split of the columns gave each
  // thread short strided runs of every row and read slower at two threads than one did
  // (10.9 vs 12.5 GB/s on SmolLM2's projections). The rows go in kBlocks fixed blocks (a
  // multiple of kRows rows each), each summed into its own partial rows, and the partials
  // are added in block order: the result depends on the shape only, never on the thread
  // count. The partials cost kBlocks * M * n floats, ~2% of the weight's bytes at 576 rows.
  if (m == 1) {
    auto xc = x.contiguous();
    gemv_rows<1>(w, ld, xc.data_ptr<float>(), k, n, out);
    return y;
  }
  // The inputs transposed, [k, M] (see fold_rows_m), into a buffer kept per calling
  // thread: a transposed copy as a tensor cost a clone's dispatch per call.
  auto xc = x.contiguous();
  const float* xr = xc.data_ptr<float>();
  thread_local std::vector<float> transposed;
  if (transposed.size() < static_cast<size_t>(k * m)) transposed.resize(k * m);
  float* xs = transposed.data();
  for (int64_t i = 0; i < m; i++) {
    for (int64_t r = 0; r < k; r++) xs[r * m + i] = xr[i * k + r];
  }
  switch (m) {
    case 2: gemv_rows<2>(w, ld, xs, k, n, out); break;
    case 3: gemv_rows<3>(w, ld, xs, k, n, out); break;
    case 4: gemv_rows<4>(w, ld, xs, k, n, out); break;
    case 5: gemv_rows<5>(w, ld, xs, k, n, out); break;
    case 6: gemv_rows<6>(w, ld, xs, k, n, out); break;
    case 7: gemv_rows<7>(w, ld, xs, k, n, out); break;
    default: gemv_rows<8>(w, ld, xs, k, n, out); break;
  }
  return y;
}

// Registered with the dispatcher from C++, so that a compiled graph's C++ wrapper calls it
// without going through Python (a Python-implemented op cost ~10-20 us per call there).
TORCH_LIBRARY_FRAGMENT(surge, m) { m.def("gemv_row(Tensor x, Tensor wt) -> Tensor"); }
TORCH_LIBRARY_IMPL(surge, CPU, m) { m.impl("gemv_row", &gemv_row); }
