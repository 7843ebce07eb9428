// colgraph_engine._core: the native module. Thin pybind11 bindings; every entry point checks
// shapes and ranges itself as well (cheaply) so that a direct call can never read out of bounds.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "igraph_runtime.hpp"
#include "maxsim_cpu.hpp"

namespace py = pybind11;
namespace colgraph {
void bind_graph(py::module_& m);
void bind_centroid_scores(py::module_& m);
void bind_query_centroid_scores(py::module_& m);
}  // namespace colgraph
using colgraph::ElemType;
using colgraph::PackedView;

namespace {

ElemType parse_type(const std::string& name) {
  if (name == "float32") return ElemType::F32;
  if (name == "bfloat16") return ElemType::BF16;
  if (name == "float16") return ElemType::F16;
  throw py::value_error("dtype: expected 'float32', 'bfloat16' or 'float16', got '" + name + "'");
}

// Values arrive as float32 arrays, or as 16-bit integer arrays holding bf16/fp16 bit patterns
// (numpy has no bfloat16).
PackedView view_packed(const py::array& values, const py::array_t<int64_t>& offsets, ElemType type,
                       const char* what, bool check_all = true) {
  const std::string name(what);
  if (values.ndim() != 2) throw py::value_error(name + " values: expected a 2-D array");
  if (!(values.flags() & py::array::c_style))
    throw py::value_error(name + " values: expected a C-contiguous array");
  const size_t want = type == ElemType::F32 ? 4 : 2;
  if (static_cast<size_t>(values.itemsize()) != want)
    throw py::type_error(name + " values: item size does not match dtype");
  if (offsets.ndim() != 1 || offsets.shape(0) < 1)
    throw py::value_error(name + " offsets: expected a 1-D array of length n + 1 >= 1");
  if (!(offsets.flags() & py::array::c_style))
    throw py::value_error(name + " offsets: expected a C-contiguous array");
  const int64_t* off = offsets.data();
  const int64_t n = offsets.shape(0) - 1, rows = values.shape(0);
  if (off[0] != 0) throw py::value_error(name + " offsets: must start at 0");
  if (check_all)  // else the caller checks the items it reads (check_listed)
    for (int64_t i = 0; i < n; ++i)
      if (off[i + 1] < off[i]) throw py::value_error(name + " offsets: must be non-decreasing");
  if (off[n] != rows) throw py::value_error(name + " offsets: last offset must equal the row count");
  return PackedView{values.data(), off, n, static_cast<int64_t>(values.shape(1))};
}

float* view_out(py::array_t<float>& out, int64_t expected) {
  if (!(out.flags() & py::array::c_style) || !out.writeable())
    throw py::value_error("out: expected a writeable C-contiguous float32 array");
  if (out.size() != expected) throw py::value_error("out: wrong number of elements");
  return out.mutable_data();
}

void maxsim_cross(const py::array& q, const py::array_t<int64_t>& q_off, const py::array& d,
                  const py::array_t<int64_t>& d_off, py::array_t<float> out, const std::string& dtype,
                  int num_threads) {
  const ElemType type = parse_type(dtype);
  const PackedView qv = view_packed(q, q_off, type, "queries");
  const PackedView dv = view_packed(d, d_off, type, "documents");
  if (qv.dim != dv.dim) throw py::value_error("queries and documents must have the same dimension");
  float* o = view_out(out, qv.n * dv.n);
  py::gil_scoped_release release;
  colgraph::maxsim_cross_cpu(qv, dv, type, o, num_threads);
}

void maxsim_candidates(const py::array& q, const py::array_t<int64_t>& q_off, const py::array& d,
                       const py::array_t<int64_t>& d_off, const py::array_t<int64_t>& cand_offsets,
                       const py::array_t<int64_t>& cand_ids, py::array_t<float> out,
                       const std::string& dtype, int num_threads) {
  const ElemType type = parse_type(dtype);
  const PackedView qv = view_packed(q, q_off, type, "queries");
  // the documents' offsets are checked for the listed documents alone: a call scoring 10 pairs
  // against a 100,000-item store spent most of its time checking the other items' offsets
  const PackedView dv = view_packed(d, d_off, type, "documents", false);
  if (qv.dim != dv.dim) throw py::value_error("queries and documents must have the same dimension");
  if (cand_offsets.ndim() != 1 || cand_offsets.shape(0) != qv.n + 1)
    throw py::value_error("cand_offsets: expected length n_queries + 1");
  if (cand_ids.ndim() != 1) throw py::value_error("cand_ids: expected a 1-D array");
  const int64_t* co = cand_offsets.data();
  const int64_t* ci = cand_ids.data();
  const int64_t n_cand = cand_ids.shape(0);
  if (co[0] != 0 || co[qv.n] != n_cand)
    throw py::value_error("cand_offsets: must start at 0 and end at len(cand_ids)");
  for (int64_t i = 0; i < qv.n; ++i)
    if (co[i + 1] < co[i]) throw py::value_error("cand_offsets: must be non-decreasing");
  for (int64_t c = 0; c < n_cand; ++c) {
    if (ci[c] < 0 || ci[c] >= dv.n) throw py::value_error("cand_ids: id out of range");
    const int64_t lo = dv.offsets[ci[c]], hi = dv.offsets[ci[c] + 1];
    if (lo < 0 || hi < lo || hi > dv.offsets[dv.n])  // every row a listed document reads is in bounds
      throw py::value_error("documents offsets: must be non-decreasing");
  }
  float* o = view_out(out, n_cand);
  py::gil_scoped_release release;
  colgraph::maxsim_candidates_cpu(qv, dv, type, co, ci, n_cand, o, num_threads);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "colgraph_engine native module: fused CPU MaxSim and igraph-backed graph code.";
  colgraph::install_igraph_handlers();

  m.def("igraph_version", &colgraph::igraph_version_string, "Version of the linked igraph C library.");
  m.def("igraph_self_test", &colgraph::igraph_self_test,
        "Builds a 3-vertex path through igraph and returns its edge count (2).");
  m.def("cpu_kernel_isa", [](const std::string& dtype) { return colgraph::cpu_kernel_isa(parse_type(dtype)); },
        py::arg("dtype"), "Instruction set the CPU MaxSim kernel uses for this dtype.");
  m.def("maxsim_cross", &maxsim_cross, py::arg("q"), py::arg("q_offsets"), py::arg("d"),
        py::arg("d_offsets"), py::arg("out"), py::arg("dtype"), py::arg("num_threads"),
        "Writes out[i, j] = sum_t max_u <q_t, d_u> for packed queries i and documents j.");
  m.def("maxsim_candidates", &maxsim_candidates, py::arg("q"), py::arg("q_offsets"), py::arg("d"),
        py::arg("d_offsets"), py::arg("cand_offsets"), py::arg("cand_ids"), py::arg("out"),
        py::arg("dtype"), py::arg("num_threads"),
        "Writes one MaxSim score per (query, candidate) pair listed in CSR form.");
  colgraph::bind_graph(m);
  colgraph::bind_centroid_scores(m);
  colgraph::bind_query_centroid_scores(m);
#ifdef COLGRAPH_IGRAPH_VERSION
  m.attr("IGRAPH_BUILD_VERSION") = COLGRAPH_IGRAPH_VERSION;
#endif
}
