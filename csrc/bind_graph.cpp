// pybind11 bindings of colgraph::KnowledgeGraph. Arrays are checked for dtype, shape and
// contiguity here; numpy copies are made by pybind11 only when a caller passes another dtype.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "graph.hpp"

namespace py = pybind11;

namespace colgraph {
namespace {

template <class T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <class T>
const T* vec1d(const Arr<T>& a, int64_t expected, const char* name) {
  if (a.ndim() != 1) throw py::value_error(std::string(name) + ": expected a 1-D array");
  if (expected >= 0 && a.shape(0) != expected)
    throw py::value_error(std::string(name) + ": expected length " + std::to_string(expected) + ", got " + std::to_string(a.shape(0)));
  return a.data();
}

CsrView csr(const py::object& offsets, const py::object& values, int64_t nq, const char* name,
            Arr<int64_t>& keep_off, Arr<int64_t>& keep_val) {
  if (offsets.is_none()) return {};
  keep_off = offsets.cast<Arr<int64_t>>();
  keep_val = values.cast<Arr<int64_t>>();
  const int64_t* o = vec1d(keep_off, nq + 1, name);
  const int64_t* v = vec1d(keep_val, -1, name);
  if (o[0] != 0 || o[nq] != keep_val.shape(0)) throw py::value_error(std::string(name) + ": offsets must start at 0 and end at the value count");
  for (int64_t i = 0; i < nq; ++i)
    if (o[i + 1] < o[i]) throw py::value_error(std::string(name) + ": offsets must be non-decreasing");
  return {o, v};
}

template <class T, class Alloc>
py::array_t<T> to_numpy(std::vector<T, Alloc>&& v) {
  using Vec = std::vector<T, Alloc>;
  auto* holder = new Vec(std::move(v));
  py::capsule owner(holder, [](void* p) { delete static_cast<Vec*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(holder->size())}, {sizeof(T)}, holder->data(), owner);
}

}  // namespace

void bind_graph(py::module_& m) {
  py::class_<KnowledgeGraph>(m, "Graph", "Typed directed multigraph on igraph (see colgraph_engine.graph).")
      .def(py::init<>())
      .def("add_nodes", [](KnowledgeGraph& g, const Arr<uint8_t>& kind, const Arr<int64_t>& doc, const Arr<float>& weight) {
             const int64_t n = kind.ndim() == 1 ? kind.shape(0) : -1;
             const uint8_t* k = vec1d(kind, -1, "node_kind");
             const int64_t* d = vec1d(doc, n, "node_doc");
             const float* w = vec1d(weight, n, "node_weight");
             py::gil_scoped_release release;
             g.add_nodes(n, k, d, w);
           }, py::arg("kind"), py::arg("doc"), py::arg("weight"))
      .def("add_edges", [](KnowledgeGraph& g, const Arr<int64_t>& src, const Arr<int64_t>& dst, const Arr<uint8_t>& kind, const Arr<float>& weight) {
             const int64_t n = src.ndim() == 1 ? src.shape(0) : -1;
             const int64_t* s = vec1d(src, -1, "src");
             const int64_t* d = vec1d(dst, n, "dst");
             const uint8_t* k = vec1d(kind, n, "edge_kind");
             const float* w = vec1d(weight, n, "edge_weight");
             py::gil_scoped_release release;
             g.add_edges(n, s, d, k, w);
           }, py::arg("src"), py::arg("dst"), py::arg("kind"), py::arg("weight"))
      .def("set_aliases", [](KnowledgeGraph& g, const Arr<int64_t>& group_of) {
             g.set_aliases(vec1d(group_of, g.n_nodes(), "alias_group"));
           }, py::arg("group_of"))
      .def_property_readonly("n_nodes", &KnowledgeGraph::n_nodes)
      .def_property_readonly("n_edges", &KnowledgeGraph::n_edges)
      .def("edge_list", [](const KnowledgeGraph& g) {
             const int64_t m = g.n_edges();
             std::vector<int64_t> src(m), dst(m);
             g.edge_list(src.data(), dst.data());
             return py::make_tuple(to_numpy(std::move(src)), to_numpy(std::move(dst)));
           })
      .def("node_kind", [](const KnowledgeGraph& g) { return to_numpy(g.node_kind()); })
      .def("node_doc", [](const KnowledgeGraph& g) { return to_numpy(g.node_doc()); })
      .def("node_weight", [](const KnowledgeGraph& g) { return to_numpy(g.node_weight()); })
      .def("edge_kind", [](const KnowledgeGraph& g) { return to_numpy(g.edge_kind()); })
      .def("edge_weight", [](const KnowledgeGraph& g) { return to_numpy(g.edge_weight()); })
      .def("alias_of", [](const KnowledgeGraph& g) { return to_numpy(g.alias_of()); })
      .def("memory_bytes", &KnowledgeGraph::memory_bytes)
      .def("adjacency_copies", [](const KnowledgeGraph& g) {
             const HubLists& h = g.hub_lists();
             py::dict out;
             out["lists"] = h.hubs(), out["ids"] = h.copied_ids(), out["bytes"] = h.memory_bytes();
             out["budget_bytes_per_edge"] = g.copy_budget();
             return out;
           }, "Sequential int32 copies of the longest adjacency lists: lists copied, ids, bytes held, budget.")
      .def("set_copy_budget", [](KnowledgeGraph& g, double bytes_per_edge) {
             py::gil_scoped_release release;
             g.set_copy_budget(bytes_per_edge);
           }, py::arg("bytes_per_edge"))
      .def("igraph_neighbors", [](const KnowledgeGraph& g, int64_t v, int mode) { return to_numpy(g.igraph_neighbors_of(v, mode)); },
           py::arg("v"), py::arg("mode") = 0, "igraph_neighbors() on the stored graph (0 all, 1 out, 2 in).")
      .def("expand",
           [](const KnowledgeGraph& g, const Arr<int64_t>& seed_offsets, const Arr<int64_t>& seeds, int64_t hops,
              const py::object& dense_scores, const py::object& score_offsets, const py::object& score_nodes,
              const py::object& score_values, float threshold, int64_t min_keep, int64_t budget,
              uint64_t node_kind_mask, uint64_t edge_kind_mask, int direction, bool merge_aliases,
              const py::object& doc_offsets, const py::object& docs, int num_threads, bool with_edges) {
             if (seed_offsets.ndim() != 1 || seed_offsets.shape(0) < 1) throw py::value_error("seed_offsets: expected [n_queries + 1]");
             const int64_t nq = seed_offsets.shape(0) - 1;
             Arr<int64_t> so, sv, doff, dval, spo, spn;
             Arr<float> dense, spv;
             CsrView seed_view = csr(seed_offsets, seeds, nq, "seeds", so, sv);
             CsrView doc_view = csr(doc_offsets, docs, nq, "docs", doff, dval);
             ScoresView sc;
             if (!dense_scores.is_none()) {
               dense = dense_scores.cast<Arr<float>>();
               if (dense.ndim() != 2 || dense.shape(0) != nq || dense.shape(1) != g.n_nodes())
                 throw py::value_error("scores: expected a dense array of shape [n_queries, n_nodes]");
               sc.dense = dense.data();
             } else if (!score_offsets.is_none()) {
               CsrView sp = csr(score_offsets, score_nodes, nq, "score_nodes", spo, spn);
               spv = score_values.cast<Arr<float>>();
               sc.sparse_offsets = sp.offsets, sc.sparse_nodes = sp.values;
               sc.sparse_values = vec1d(spv, spn.shape(0), "score_values");
             }
             if (direction < 0 || direction > 2) throw py::value_error("direction: expected 0 (both), 1 (out) or 2 (in)");
             ExpandOptions opt;
             opt.hops = hops, opt.threshold = threshold, opt.min_keep = min_keep, opt.budget = budget;
             opt.node_kind_mask = node_kind_mask, opt.edge_kind_mask = edge_kind_mask;
             opt.direction = static_cast<Direction>(direction), opt.merge_aliases = merge_aliases;
             opt.with_edges = with_edges;
             Expansion ex;
             {
               py::gil_scoped_release release;
               ex = g.expand(nq, seed_view, sc, doc_view, opt, num_threads);
             }
             py::dict out;
             out["node_offsets"] = to_numpy(std::move(ex.node_offsets));
             out["nodes"] = to_numpy(std::move(ex.nodes));
             out["hop"] = to_numpy(std::move(ex.hop));
             out["seed"] = to_numpy(std::move(ex.seed));
             out["parent"] = to_numpy(std::move(ex.parent));
             out["parent_edge"] = to_numpy(std::move(ex.parent_edge));
             out["score"] = to_numpy(std::move(ex.score));
             out["edge_offsets"] = to_numpy(std::move(ex.edge_offsets));
             out["edges"] = to_numpy(std::move(ex.edges));
             return out;
           },
           py::arg("seed_offsets"), py::arg("seeds"), py::arg("hops"), py::arg("dense_scores") = py::none(),
           py::arg("score_offsets") = py::none(), py::arg("score_nodes") = py::none(),
           py::arg("score_values") = py::none(), py::arg("threshold") = 0.0f, py::arg("min_keep") = 0,
           py::arg("budget") = -1, py::arg("node_kind_mask") = ~0ull, py::arg("edge_kind_mask") = ~0ull,
           py::arg("direction") = 0, py::arg("merge_aliases") = false, py::arg("doc_offsets") = py::none(),
           py::arg("docs") = py::none(), py::arg("num_threads") = 1, py::arg("with_edges") = true);
}

}  // namespace colgraph
