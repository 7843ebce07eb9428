// Full centroid scores of the prefilter's adaptive budget (colgraph_engine/prefilter/adaptive.py):
//   F(x) = sum_i max_{c in cells(x)} S[i, c]
// for listed items x, with st = S transposed ([C, L], one row per centroid). numpy computes the
// same as take + maximum.reduceat + sum, which materialises an [E, L] gather per call; this walks
// each item's cells once with an L-wide running maximum, held in AVX-512 (L <= 64) or AVX2
// (L <= 32) registers where the CPU has them, else in a scalar loop.
//
// The sum over the L query tokens repeats numpy's pairwise float32 summation (8 partial sums,
// blocks of 128, halves above that) so that both paths give the same bits and so the same
// candidates: F decides which items reach the exact stage.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <immintrin.h>

#include "parallel.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace colgraph {
namespace {

template <class T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

// numpy's pairwise_sum for float32 (numpy/_core/src/umath/loops_utils.h.src), unit stride.
float pairwise_sum(const float* a, int64_t n) {
  if (n < 8) {
    float res = 0.f;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    float r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

// The walk over each listed item's cells, the row maximum kept in registers. Returns an error
// message, or nullptr. `Kernel` is one of the three below; every one computes the same bits: max
// is exact, and the L maxima go to the same pairwise sum.
template <class CellT, class Kernel>
const char* walk_items(const float* s, int64_t C, int64_t L, const int64_t* co, const CellT* cv, int64_t E,
                       int64_t N, const int64_t* pos, int64_t n, float* o, Kernel&& row_max) {
  for (int64_t p = 0; p < n; ++p) {
    const int64_t x = pos[p];
    if (x < 0 || x >= N) return "positions: position out of range";
    const int64_t a = co[x], b = co[x + 1];
    if (a < 0 || b < a || b > E) return "cells_offsets: bad range";
    if (a == b) {  // an item without centroids (no tokens)
      o[p] = -std::numeric_limits<float>::infinity();
      continue;
    }
    bool bad = false;  // the kernels check each cell before reading its row: never out of bounds
    o[p] = row_max(s, C, L, cv + a, b - a, bad);
    if (bad) return "cells: centroid out of range";
  }
  return nullptr;
}

// Row c of st, or nullptr when c is no centroid (a negative id wraps to a large one): every
// kernel checks each cell this way before it reads the row, so nothing is read out of bounds.
template <class CellT>
inline const float* centroid_row(const float* s, int64_t C, int64_t L, CellT cell) {
  const int64_t c = static_cast<int64_t>(cell);
  return static_cast<uint64_t>(c) < static_cast<uint64_t>(C) ? s + c * L : nullptr;
}

// Up to 64 query tokens in NV 16-lane registers (AVX-512): one masked load and one max per
// register and cell. A masked load reads nothing past the row; masked lanes hold 0 and are
// never summed. The scalar loop kept the maxima in memory, a store-to-load chain per token and
// cell (6.9 ns a cell at L = 8, 10,000 documents).
template <int NV, class CellT>
__attribute__((target("avx512f"))) float row_max_avx512(const float* s, int64_t C, int64_t L, const CellT* cells, int64_t m, bool& bad) {
  __m512 best[NV];
  __mmask16 mask[NV];
  for (int v = 0; v < NV; ++v) {
    best[v] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const int64_t lanes = std::clamp<int64_t>(L - 16 * v, 0, 16);
    mask[v] = static_cast<__mmask16>((1u << lanes) - 1u);
  }
  for (int64_t e = 0; e < m; ++e) {
    const float* row = centroid_row(s, C, L, cells[e]);
    if (!row) {
      bad = true;
      return 0.0f;
    }
    // max(row, best): best stays where the row is NaN, as the scalar loop's `row > best`
    for (int v = 0; v < NV; ++v) best[v] = _mm512_max_ps(_mm512_maskz_loadu_ps(mask[v], row + 16 * v), best[v]);
  }
  alignas(64) float out[NV * 16];
  for (int v = 0; v < NV; ++v) _mm512_store_ps(out + 16 * v, best[v]);
  return pairwise_sum(out, L);
}

// The same with 8-lane registers (AVX2), up to 32 tokens.
template <int NV, class CellT>
__attribute__((target("avx2"))) float row_max_avx2(const float* s, int64_t C, int64_t L, const CellT* cells, int64_t m, bool& bad) {
  __m256 best[NV];
  __m256i mask[NV];
  for (int v = 0; v < NV; ++v) {
    best[v] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    alignas(32) int32_t bits[8];
    for (int l = 0; l < 8; ++l) bits[l] = 8 * v + l < L ? -1 : 0;
    mask[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bits));
  }
  for (int64_t e = 0; e < m; ++e) {
    const float* row = centroid_row(s, C, L, cells[e]);
    if (!row) {
      bad = true;
      return 0.0f;
    }
    for (int v = 0; v < NV; ++v) best[v] = _mm256_max_ps(_mm256_maskload_ps(row + 8 * v, mask[v]), best[v]);
  }
  alignas(32) float out[NV * 8];
  for (int v = 0; v < NV; ++v) _mm256_store_ps(out + 8 * v, best[v]);
  return pairwise_sum(out, L);
}

// Any L, any CPU.
template <class CellT>
struct RowMaxScalar {
  std::vector<float> best;
  float operator()(const float* s, int64_t C, int64_t L, const CellT* cells, int64_t m, bool& bad) {
    best.assign(static_cast<size_t>(L), -std::numeric_limits<float>::infinity());
    for (int64_t e = 0; e < m; ++e) {
      const float* row = centroid_row(s, C, L, cells[e]);
      if (!row) {
        bad = true;
        return 0.0f;
      }
      for (int64_t i = 0; i < L; ++i) best[i] = row[i] > best[i] ? row[i] : best[i];
    }
    return pairwise_sum(best.data(), L);
  }
};

enum class Isa { Auto, Avx512, Avx2, Scalar };

Isa parse_isa(const std::string& name) {
  if (name == "auto") return Isa::Auto;
  if (name == "avx512") {
    if (!__builtin_cpu_supports("avx512f")) throw py::value_error("isa: this CPU has no AVX-512F");
    return Isa::Avx512;
  }
  if (name == "avx2") {
    if (!__builtin_cpu_supports("avx2")) throw py::value_error("isa: this CPU has no AVX2");
    return Isa::Avx2;
  }
  if (name == "scalar") return Isa::Scalar;
  throw py::value_error("isa: expected 'auto', 'avx512', 'avx2' or 'scalar', got '" + name + "'");
}

// The widest kernel the CPU and L allow (`isa` narrows it, for tests); one that does not fit L
// falls back to the scalar loop.
template <class CellT>
const char* run_walk(Isa isa, const float* s, int64_t C, int64_t L, const int64_t* co, const CellT* cv, int64_t E,
                     int64_t N, const int64_t* pos, int64_t n, float* o) {
  auto walk = [&](auto&& kernel) { return walk_items(s, C, L, co, cv, E, N, pos, n, o, kernel); };
  const bool avx512 = isa == Isa::Avx512 || (isa == Isa::Auto && __builtin_cpu_supports("avx512f"));
  const bool avx2 = isa == Isa::Avx2 || (isa == Isa::Auto && !avx512 && __builtin_cpu_supports("avx2"));
  if (avx512 && L >= 1 && L <= 64) {
    switch ((L + 15) / 16) {
      case 1: return walk(row_max_avx512<1, CellT>);
      case 2: return walk(row_max_avx512<2, CellT>);
      case 3: return walk(row_max_avx512<3, CellT>);
      default: return walk(row_max_avx512<4, CellT>);
    }
  }
  if (avx2 && L >= 1 && L <= 32) {
    switch ((L + 7) / 8) {
      case 1: return walk(row_max_avx2<1, CellT>);
      case 2: return walk(row_max_avx2<2, CellT>);
      case 3: return walk(row_max_avx2<3, CellT>);
      default: return walk(row_max_avx2<4, CellT>);
    }
  }
  return walk(RowMaxScalar<CellT>{});
}

// Items per task when the walk is shared among threads: a task costs ~0.1 ms at 10,000 documents
// (~50 cells of L = 10 an item), well above a task pull, and a first probe's 8-17k candidates
// still make several tasks per thread (ours).
constexpr int64_t ITEMS_PER_TASK = 1024;

template <class CellT>
py::array_t<float> full_centroid_scores(const Arr<float>& st, const Arr<int64_t>& cells_offsets,
                                        const py::array_t<CellT, py::array::c_style | py::array::forcecast>& cells,
                                        const Arr<int64_t>& positions, const std::string& isa_name, int num_threads) {
  const Isa isa = parse_isa(isa_name);
  if (num_threads < 1) throw py::value_error("num_threads: expected a positive int, got " + std::to_string(num_threads));
  if (st.ndim() != 2) throw py::value_error("st: expected a 2-D [C, L] float32 array");
  if (cells_offsets.ndim() != 1 || cells_offsets.shape(0) < 1)
    throw py::value_error("cells_offsets: expected a 1-D array of length N + 1");
  if (cells.ndim() != 1) throw py::value_error("cells: expected a 1-D array");
  if (positions.ndim() != 1) throw py::value_error("positions: expected a 1-D array");
  const int64_t C = st.shape(0), L = st.shape(1), N = cells_offsets.shape(0) - 1, E = cells.shape(0);
  const int64_t n = positions.shape(0);
  py::array_t<float> out(n);
  const char* error = nullptr;  // checked in the same pass as the work; raised after it
  {
    py::gil_scoped_release release;
    // items are independent: any split gives the same bits as one walk
    const int64_t tasks = (n + ITEMS_PER_TASK - 1) / ITEMS_PER_TASK;
    const float* s = st.data();
    const int64_t* co = cells_offsets.data();
    const CellT* cv = cells.data();
    const int64_t* pos = positions.data();
    float* o = out.mutable_data();
    std::atomic<const char*> first_error{nullptr};  // walk_items' messages are string literals
    try {
      parallel_workers(tasks, worker_count(tasks, num_threads), [&](int64_t t, int) {
        const int64_t a = t * ITEMS_PER_TASK, m = std::min(n - a, ITEMS_PER_TASK);
        if (const char* e = run_walk<CellT>(isa, s, C, L, co, cv, E, N, pos + a, m, o + a)) {
          const char* none = nullptr;
          first_error.compare_exchange_strong(none, e);
          throw std::invalid_argument(e);  // stops the tasks not started yet
        }
      });
    } catch (const std::invalid_argument&) {
    }
    error = first_error.load();
  }
  if (error) throw py::value_error(error);  // the half-filled output is dropped with it
  return out;
}

}  // namespace

void bind_centroid_scores(py::module_& m) {
  // int32 cells (the prefilter's own dtype) first, so they are read without a copy; anything else as int64
  m.def("full_centroid_scores", &full_centroid_scores<int32_t>, py::arg("st"), py::arg("cells_offsets"),
        py::arg("cells").noconvert(), py::arg("positions"), py::arg("isa") = "auto", py::arg("num_threads") = 1,
        "out[p] = sum_i max over the cells of item positions[p] of st[c, i] (st: [C, L] float32); "
        "-inf for an item without cells. isa: 'auto' (the widest the CPU has), 'avx512', 'avx2' or "
        "'scalar' (the same bits on every one; a vector kernel that does not fit L runs the scalar loop). "
        "num_threads: threads sharing the items (the same bits for any count).");
  m.def("full_centroid_scores", &full_centroid_scores<int64_t>, py::arg("st"), py::arg("cells_offsets"), py::arg("cells"),
        py::arg("positions"), py::arg("isa") = "auto", py::arg("num_threads") = 1);
}

}  // namespace colgraph
