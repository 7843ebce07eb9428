// Full centroid scores of the prefilter's adaptive budget (colgraph_engine/prefilter/adaptive.py):
//   F(x) = sum_i max_{c in cells(x)} S[i, c]
// for listed items x, with st = S transposed ([C, L], one row per centroid). numpy computes the
// same as take + maximum.reduceat + sum, which materialises an [E, L] gather per call; this walks
// each item's cells once with an L-wide running maximum.
//
// The sum over the L query tokens repeats numpy's pairwise float32 summation (8 partial sums,
// blocks of 128, halves above that) so that both paths give the same bits and so the same
// candidates: F decides which items reach the exact stage.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <limits>
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

py::array_t<float> full_centroid_scores(const Arr<float>& st, const Arr<int64_t>& cells_offsets,
                                        const Arr<int64_t>& cells, const Arr<int64_t>& positions) {
  if (st.ndim() != 2) throw py::value_error("st: expected a 2-D [C, L] float32 array");
  if (cells_offsets.ndim() != 1 || cells_offsets.shape(0) < 1)
    throw py::value_error("cells_offsets: expected a 1-D array of length N + 1");
  if (cells.ndim() != 1) throw py::value_error("cells: expected a 1-D array");
  if (positions.ndim() != 1) throw py::value_error("positions: expected a 1-D array");
  const int64_t C = st.shape(0), L = st.shape(1), N = cells_offsets.shape(0) - 1, E = cells.shape(0);
  const int64_t n = positions.shape(0);
  const float* s = st.data();
  const int64_t* co = cells_offsets.data();
  const int64_t* cv = cells.data();
  const int64_t* pos = positions.data();
  py::array_t<float> out(n);
  float* o = out.mutable_data();
  const char* error = nullptr;  // checked in the same pass as the work (one walk over the cells); raised after it
  {
    py::gil_scoped_release release;
    std::vector<float> best(static_cast<size_t>(L));
    for (int64_t p = 0; p < n && !error; ++p) {
      const int64_t x = pos[p];
      if (x < 0 || x >= N) {
        error = "positions: position out of range";
        break;
      }
      const int64_t a = co[x], b = co[x + 1];
      if (a < 0 || b < a || b > E) {
        error = "cells_offsets: bad range";
        break;
      }
      if (a == b) {  // an item without centroids (no tokens)
        o[p] = -std::numeric_limits<float>::infinity();
        continue;
      }
      for (int64_t i = 0; i < L; ++i) best[i] = -std::numeric_limits<float>::infinity();
      for (int64_t e = a; e < b; ++e) {
        if (cv[e] < 0 || cv[e] >= C) {  // before the read: never out of bounds
          error = "cells: centroid out of range";
          break;
        }
        const float* row = s + cv[e] * L;
        for (int64_t i = 0; i < L; ++i) best[i] = row[i] > best[i] ? row[i] : best[i];
      }
      o[p] = pairwise_sum(best.data(), L);
    }
  }
  if (error) throw py::value_error(error);  // the half-filled output is dropped with it
  return out;
}

}  // namespace

void bind_centroid_scores(py::module_& m) {
  m.def("full_centroid_scores", &full_centroid_scores, py::arg("st"), py::arg("cells_offsets"), py::arg("cells"),
        py::arg("positions"),
        "out[p] = sum_i max over the cells of item positions[p] of st[c, i] (st: [C, L] float32); "
        "-inf for an item without cells.");
}

}  // namespace colgraph
