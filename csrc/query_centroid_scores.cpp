// Centroid scores of the prefilter's adaptive search (colgraph_engine/prefilter/adaptive.py,
// PLAID's stage 1):
//   S[i, c] = <q_i, centroid_c>        q: [T, d]; centroids in blocks of 16: blocks [B, d, 16]
// On the project's CPU the BLAS call it replaces read the [C, d] centroids (8 MB at 10,000
// documents) on one thread and repacked them on each call: 2.2 ms a 10-token query, most of it
// waiting on memory. Here the centroids are stored once in the layout the kernel reads (block b
// holds centroids 16b .. 16b + 15 transposed, [d, 16], zero past C: one contiguous 8 KB stretch
// at d = 128, which the hardware prefetcher follows), and each block is read once for every query
// token, on the native kernels' threads (each thread streams its own blocks).
//
// Each S[i, c] is one float32 FMA chain over k = 0 .. d-1 in that order (16 centroids in the
// lanes of one register, q_i[k] broadcast), so the result does not depend on the thread count or
// the CPU's vector width: the AVX-512 path and the scalar path give the same bits.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <immintrin.h>

#include "parallel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>

namespace py = pybind11;

namespace colgraph {
namespace {

using Arr = py::array_t<float, py::array::c_style | py::array::forcecast>;

constexpr int64_t kLanes = 16;    // centroids per register
constexpr int kTokens = 12;       // query tokens per register tile (ours: 12 accumulators + loads fit 32 zmm)
constexpr int64_t kBlocksPerTask = 32;  // ours: 512 centroids a task, ~0.25 ms of work per 10 tokens at d = 128

// S[t0 .. t0 + nt, c0 .. c0 + 16) for nt <= kTokens tokens, lanes past C masked off.
template <int NT>
__attribute__((target("avx512f"))) void tile_avx512(const float* q, int64_t d, const float* blk, int64_t C, int64_t c0,
                                                    float* out, int64_t t0) {
  const int64_t lanes = std::min<int64_t>(kLanes, C - c0);
  const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < d; ++k) {
    const __m512 c = _mm512_loadu_ps(blk + k * kLanes);
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(q[(t0 + t) * d + k]), c, acc[t]);
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(out + (t0 + t) * C + c0, mask, acc[t]);
}

using Tile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <int... N>
constexpr auto make_tiles(std::integer_sequence<int, N...>) {
  return std::array<Tile, sizeof...(N)>{&tile_avx512<N + 1>...};
}

// One block of 16 centroids for every token: tiles of kTokens tokens, the tail tile narrower.
void block_avx512(const float* q, int64_t T, int64_t d, const float* blk, int64_t C, int64_t c0, float* out) {
  static constexpr auto tiles = make_tiles(std::make_integer_sequence<int, kTokens>{});
  for (int64_t t0 = 0; t0 < T; t0 += kTokens) tiles[std::min<int64_t>(kTokens, T - t0) - 1](q, d, blk, C, c0, out, t0);
}

// The same chains without vector registers: fmaf per lane, k in order.
void block_scalar(const float* q, int64_t T, int64_t d, const float* blk, int64_t C, int64_t c0, float* out) {
  const int64_t lanes = std::min<int64_t>(kLanes, C - c0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < lanes; ++l) {
      float acc = 0.0f;
      for (int64_t k = 0; k < d; ++k) acc = std::fmaf(q[t * d + k], blk[k * kLanes + l], acc);
      out[t * C + c0 + l] = acc;
    }
}

py::array_t<float> query_centroid_scores(const Arr& q, const Arr& blocks_in, int64_t C, const std::string& isa,
                                         int num_threads) {
  if (num_threads < 1) throw py::value_error("num_threads: expected a positive int, got " + std::to_string(num_threads));
  if (q.ndim() != 2) throw py::value_error("q: expected a 2-D [T, d] float32 array");
  const int64_t T = q.shape(0), d = q.shape(1);
  if (blocks_in.ndim() != 3 || blocks_in.shape(1) != d || blocks_in.shape(2) != kLanes)
    throw py::value_error("blocks: expected a [B, " + std::to_string(d) + ", 16] float32 array (centroid_blocks)");
  if (C < 0 || (C + kLanes - 1) / kLanes != blocks_in.shape(0))
    throw py::value_error("n_centroids: expected a count that fills the " + std::to_string(blocks_in.shape(0)) +
                          " blocks (16 each, the last one partly), got " + std::to_string(C));
  bool vector = __builtin_cpu_supports("avx512f");
  if (isa == "scalar") {
    vector = false;
  } else if (isa == "avx512") {
    if (!vector) throw py::value_error("isa: this CPU has no AVX-512F");
  } else if (isa != "auto") {
    throw py::value_error("isa: expected 'auto', 'avx512' or 'scalar', got '" + isa + "'");
  }
  py::array_t<float> out({T, C});
  if (T == 0 || C == 0) return out;
  const float* qp = q.data();
  const float* cp = blocks_in.data();
  float* op = out.mutable_data();
  {
    py::gil_scoped_release release;
    const int64_t blocks = (C + kLanes - 1) / kLanes, tasks = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
    const int threads = std::min(worker_count(tasks, num_threads), threads_for_work(T * C * d, num_threads));
    // disjoint output columns per task: any split gives the same bits
    parallel_workers(tasks, threads, [&](int64_t task, int) {
      const int64_t b1 = std::min(blocks, (task + 1) * kBlocksPerTask);
      for (int64_t b = task * kBlocksPerTask; b < b1; ++b) {
        const float* blk = cp + b * d * kLanes;
        if (vector)
          block_avx512(qp, T, d, blk, C, b * kLanes, op);
        else
          block_scalar(qp, T, d, blk, C, b * kLanes, op);
      }
    });
  }
  return out;
}

}  // namespace

void bind_query_centroid_scores(py::module_& m) {
  m.def("query_centroid_scores", &query_centroid_scores, py::arg("q"), py::arg("blocks"), py::arg("n_centroids"),
        py::arg("isa") = "auto", py::arg("num_threads") = 1,
        "S[i, c] = <q[i], centroid c>: q [T, d] float32; blocks [B, d, 16] float32, block b holding centroids "
        "16b .. 16b + 15 transposed (zero past n_centroids); returns [T, n_centroids] float32. Each entry is one "
        "float32 FMA chain over k in order, so every isa ('auto', 'avx512', 'scalar') and thread count gives "
        "the same bits.");
}

}  // namespace colgraph
