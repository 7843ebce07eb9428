#include "graph.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "huge_pages.hpp"
#include "igraph_runtime.hpp"
#include "parallel.hpp"

namespace colgraph {
namespace {

// Appends `count` weights to a lazily materialised column holding `old_count` entries.
void append_weights(std::vector<float>& column, int64_t old_count, const float* weight, int64_t count) {
  if (column.empty() && std::all_of(weight, weight + count, [](float w) { return w == 1.0f; })) return;
  if (column.empty()) column.assign(old_count, 1.0f);
  column.insert(column.end(), weight, weight + count);
}

std::vector<float> read_weights(const std::vector<float>& column, int64_t count) {
  return column.empty() ? std::vector<float>(count, 1.0f) : column;
}

constexpr int64_t kInt32Max = 2147483647;

// Capacity for `need` elements, growing geometrically: appending a small batch to a large
// column must not copy the whole column each time (an exact reserve would).
template <typename T>
void reserve_geometric(std::vector<T>& v, size_t need) {
  if (need > v.capacity()) v.reserve(std::max(need, 2 * v.capacity()));
}

void reserve_geometric(igraph_vector_int_t* v, igraph_integer_t need) {
  const igraph_integer_t cap = igraph_vector_int_capacity(v);
  if (need > cap) check_igraph(igraph_vector_int_reserve(v, std::max(need, 2 * cap)), "igraph_vector_int_reserve");
}

}  // namespace

KnowledgeGraph::KnowledgeGraph() {
  check_igraph(igraph_empty(&graph_, 0, IGRAPH_DIRECTED), "igraph_empty");
  group_offsets_.push_back(0);
}

KnowledgeGraph::~KnowledgeGraph() { igraph_destroy(&graph_); }

int64_t KnowledgeGraph::n_nodes() const { return igraph_vcount(&graph_); }
int64_t KnowledgeGraph::n_edges() const { return igraph_ecount(&graph_); }

void KnowledgeGraph::add_nodes(int64_t count, const uint8_t* kind, const int64_t* doc, const float* weight) {
  if (count < 0) throw std::invalid_argument("count: expected >= 0");
  for (int64_t i = 0; i < count; ++i) {
    if (kind[i] >= 64) throw std::invalid_argument(at("node_kind", i) + ": expected a kind in [0, 64)");
    if (doc[i] < 0 || doc[i] > kInt32Max) throw std::invalid_argument(at("node_doc", i) + ": expected a document id in [0, 2^31)");
    if (!std::isfinite(weight[i])) throw std::invalid_argument(at("node_weight", i) + ": expected a finite weight");
  }
  std::unique_lock lock(mutex_);
  if (n_nodes() + count > kInt32Max) throw std::invalid_argument("count: a graph holds at most 2^31 - 1 nodes");
  const int64_t old_n = n_nodes();
  reserve_geometric(node_kind_, old_n + count), reserve_geometric(node_doc_, old_n + count);
  reserve_geometric(alias_of_, old_n + count);
  if (!node_weight_.empty()) reserve_geometric(node_weight_, old_n + count);
  reserve_geometric(&graph_.os, old_n + count + 1), reserve_geometric(&graph_.is, old_n + count + 1);
  check_igraph(igraph_add_vertices(&graph_, count, nullptr), "igraph_add_vertices");
  node_kind_.insert(node_kind_.end(), kind, kind + count);
  node_doc_.insert(node_doc_.end(), doc, doc + count);
  append_weights(node_weight_, old_n, weight, count);
  alias_of_.insert(alias_of_.end(), count, -1);
  for (int64_t i = 0; i < count; ++i) max_doc_ = std::max(max_doc_, doc[i]);
}

void KnowledgeGraph::add_edges(int64_t count, const int64_t* src, const int64_t* dst, const uint8_t* kind,
                               const float* weight) {
  if (count < 0) throw std::invalid_argument("count: expected >= 0");
  std::unique_lock lock(mutex_);
  const int64_t n = n_nodes();
  // igraph would silently grow the graph for an out-of-range id: reject first.
  for (int64_t i = 0; i < count; ++i) {
    if (src[i] < 0 || src[i] >= n) throw std::invalid_argument(at("src", i) + " = " + std::to_string(src[i]) + ": expected a node id in [0, " + std::to_string(n) + ")");
    if (dst[i] < 0 || dst[i] >= n) throw std::invalid_argument(at("dst", i) + " = " + std::to_string(dst[i]) + ": expected a node id in [0, " + std::to_string(n) + ")");
    if (kind[i] >= 64) throw std::invalid_argument(at("edge_kind", i) + ": expected a kind in [0, 64)");
    if (!std::isfinite(weight[i])) throw std::invalid_argument(at("edge_weight", i) + ": expected a finite weight");
  }
  const int64_t old_m = n_edges();
  reserve_geometric(edge_kind_, old_m + count);
  if (!edge_weight_.empty()) reserve_geometric(edge_weight_, old_m + count);
  int64_t lowest = n;
  for (int64_t i = 0; i < count; ++i) lowest = std::min({lowest, src[i], dst[i]});
  if (old_m == 0) {
    bulk_load_edges(count, src, dst);
  } else if (count > 0 && lowest > max_endpoint_) {
    append_edges_above(count, src, dst, lowest);
  } else {
    igraph_vector_int_t pairs;
    check_igraph(igraph_vector_int_init(&pairs, 2 * count), "igraph_vector_int_init");
    for (int64_t i = 0; i < count; ++i) VECTOR(pairs)[2 * i] = src[i], VECTOR(pairs)[2 * i + 1] = dst[i];
    const igraph_error_t rc = igraph_add_edges(&graph_, &pairs, nullptr);
    igraph_vector_int_destroy(&pairs);
    check_igraph(rc, "igraph_add_edges");
  }
  edge_kind_.insert(edge_kind_.end(), kind, kind + count);
  append_weights(edge_weight_, old_m, weight, count);
  const bool appended_above = old_m > 0 && count > 0 && lowest > max_endpoint_;
  for (int64_t i = 0; i < count; ++i) max_endpoint_ = std::max({max_endpoint_, src[i], dst[i]});
  if (appended_above) {
    hub_lists_.extend(graph_, copy_budget_, lowest);  // older nodes' lists are unchanged
  } else {
    hub_lists_.build(graph_, copy_budget_);
    advise_storage();
  }
}

void KnowledgeGraph::set_copy_budget(double bytes_per_edge) {
  if (!std::isfinite(bytes_per_edge) || bytes_per_edge < 0)
    throw std::invalid_argument("bytes_per_edge: expected a finite number >= 0");
  std::unique_lock lock(mutex_);
  copy_budget_ = bytes_per_edge;
  hub_lists_.build(graph_, copy_budget_);
}

void KnowledgeGraph::advise_storage() {
  for (const igraph_vector_int_t* v : {&graph_.from, &graph_.to, &graph_.oi, &graph_.ii, &graph_.os, &graph_.is})
    advise_huge_pages(VECTOR(*v), sizeof(igraph_integer_t) * igraph_vector_int_size(v), true);
  advise_huge_pages(node_doc_.data(), sizeof(int32_t) * node_doc_.size(), true);
  advise_huge_pages(alias_of_.data(), sizeof(int32_t) * alias_of_.size(), true);
}

namespace {

// Edge ids ordered by (primary, secondary, id): one counting sort by `primary` (ids stay in
// ascending order within a bucket), then a small sort of each bucket by `secondary`. `start`
// receives the [n + 1] bucket starts, exactly igraph's os/is vectors.
void order_edges(const igraph_integer_t* primary, const igraph_integer_t* secondary, int64_t n, int64_t m,
                 igraph_integer_t* out, igraph_integer_t* start) {
  std::fill(start, start + n + 1, 0);
  for (int64_t e = 0; e < m; ++e) ++start[primary[e] + 1];
  for (int64_t v = 0; v < n; ++v) start[v + 1] += start[v];
  std::vector<igraph_integer_t> fill(start, start + n);
  for (int64_t e = 0; e < m; ++e) out[fill[primary[e]]++] = e;
  for (int64_t v = 0; v < n; ++v)
    if (start[v + 1] - start[v] > 1)
      std::sort(out + start[v], out + start[v + 1], [&](igraph_integer_t a, igraph_integer_t b) {
        return secondary[a] != secondary[b] ? secondary[a] < secondary[b] : a < b;
      });
}

}  // namespace

// First edges of a graph, written straight into igraph's indexed edge list: from/to, then
// oi = edges ordered by (from, to), ii = by (to, from), os/is = where each vertex's run starts.
// This is the structure igraph_add_edges builds (igraph's own functions keep working on it, see
// the neighbours test), with an array counting sort instead of igraph's linked-list radix sort,
// which is several times slower on millions of edges. The property cache is invalidated after.
void KnowledgeGraph::bulk_load_edges(int64_t m, const int64_t* src, const int64_t* dst) {
  const int64_t n = n_nodes();
  check_igraph(igraph_vector_int_resize(&graph_.from, m), "igraph_vector_int_resize");
  check_igraph(igraph_vector_int_resize(&graph_.to, m), "igraph_vector_int_resize");
  check_igraph(igraph_vector_int_resize(&graph_.oi, m), "igraph_vector_int_resize");
  check_igraph(igraph_vector_int_resize(&graph_.ii, m), "igraph_vector_int_resize");
  check_igraph(igraph_vector_int_resize(&graph_.os, n + 1), "igraph_vector_int_resize");
  check_igraph(igraph_vector_int_resize(&graph_.is, n + 1), "igraph_vector_int_resize");
  for (const igraph_vector_int_t* v : {&graph_.from, &graph_.to, &graph_.oi, &graph_.ii})
    advise_huge_pages(VECTOR(*v), sizeof(igraph_integer_t) * m, false);  // before the first write
  igraph_integer_t* from = VECTOR(graph_.from);
  igraph_integer_t* to = VECTOR(graph_.to);
  std::copy(src, src + m, from);
  std::copy(dst, dst + m, to);  // (add_edges updates max_endpoint_ after)
  // The two orders are independent: one thread each (this also spreads the kernel's zeroing of
  // the fresh pages they fill, about half of a large build).
  parallel_workers(2, m >= (int64_t{1} << 16) ? 2 : 1, [&](int64_t task, int) {
    if (task == 0) order_edges(from, to, n, m, VECTOR(graph_.oi), VECTOR(graph_.os));
    else order_edges(to, from, n, m, VECTOR(graph_.ii), VECTOR(graph_.is));
  });
  igraph_invalidate_cache(&graph_);
}

// Edges whose endpoints all lie above every endpoint of the edges already stored (a new
// document's edges among its own new nodes): ordered by (from, to, id) they all come after the
// old edges in oi and ii, and only the start entries of their vertices change, so they are
// appended in O(count + vertices they span) instead of igraph_add_edges' re-sort of all edges.
// The result is the structure igraph_add_edges (and bulk_load_edges) would build.
void KnowledgeGraph::append_edges_above(int64_t count, const int64_t* src, const int64_t* dst, int64_t lowest) {
  const int64_t n = n_nodes(), m = n_edges(), span = n - lowest;
  const igraph_integer_t* was = VECTOR(graph_.from);
  for (igraph_vector_int_t* v : {&graph_.from, &graph_.to, &graph_.oi, &graph_.ii}) {
    reserve_geometric(v, m + count);
    check_igraph(igraph_vector_int_resize(v, m + count), "igraph_vector_int_resize");
  }
  igraph_integer_t* from = VECTOR(graph_.from) + m;
  igraph_integer_t* to = VECTOR(graph_.to) + m;
  std::vector<igraph_integer_t> a(count), b(count), order(count), start(span + 1);
  for (int64_t i = 0; i < count; ++i) from[i] = src[i], to[i] = dst[i], a[i] = src[i] - lowest, b[i] = dst[i] - lowest;
  for (int pass = 0; pass < 2; ++pass) {
    order_edges(pass == 0 ? a.data() : b.data(), pass == 0 ? b.data() : a.data(), span, count, order.data(), start.data());
    igraph_integer_t* index = VECTOR(pass == 0 ? graph_.oi : graph_.ii) + m;
    igraph_integer_t* starts = VECTOR(pass == 0 ? graph_.os : graph_.is) + lowest;
    for (int64_t j = 0; j < count; ++j) index[j] = m + order[j];
    for (int64_t v = 0; v <= span; ++v) starts[v] = m + start[v];
  }
  igraph_invalidate_cache(&graph_);
  if (VECTOR(graph_.from) != was) advise_storage();  // the vectors grew into new memory
}

std::vector<int64_t> KnowledgeGraph::igraph_neighbors_of(int64_t v, int mode) const {
  std::shared_lock lock(mutex_);
  if (v < 0 || v >= n_nodes()) throw std::invalid_argument("v: node id out of range");
  igraph_vector_int_t out;
  check_igraph(igraph_vector_int_init(&out, 0), "igraph_vector_int_init");
  const igraph_neimode_t m = mode == 1 ? IGRAPH_OUT : mode == 2 ? IGRAPH_IN : IGRAPH_ALL;
  const igraph_error_t rc = igraph_neighbors(&graph_, &out, v, m);
  std::vector<int64_t> result(VECTOR(out), VECTOR(out) + (rc == IGRAPH_SUCCESS ? igraph_vector_int_size(&out) : 0));
  igraph_vector_int_destroy(&out);
  check_igraph(rc, "igraph_neighbors");
  return result;
}

void KnowledgeGraph::set_aliases(const int64_t* group_of) {
  std::unique_lock lock(mutex_);
  const int64_t n = n_nodes();
  int64_t n_groups = 0;
  for (int64_t v = 0; v < n; ++v) {
    // bounded by the node count too: the group table is sized by the largest id (Python renumbers densely)
    if (group_of[v] < -1 || group_of[v] >= kInt32Max || group_of[v] >= n)
      throw std::invalid_argument(at("alias_group", v) + ": expected a group id in [0, min(n_nodes, 2^31 - 1)) or -1");
    n_groups = std::max(n_groups, group_of[v] + 1);
  }
  std::vector<int64_t> offsets(n_groups + 1, 0), members;
  for (int64_t v = 0; v < n; ++v)
    if (group_of[v] >= 0) ++offsets[group_of[v] + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  members.resize(offsets[n_groups]);
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t v = 0; v < n; ++v)  // ascending v keeps each group's members sorted
    if (group_of[v] >= 0) members[fill[group_of[v]]++] = v;
  alias_of_.assign(group_of, group_of + n);
  group_offsets_ = std::move(offsets);
  group_members_ = std::move(members);
}

void KnowledgeGraph::edge_list(int64_t* src, int64_t* dst) const {
  std::shared_lock lock(mutex_);
  const int64_t m = n_edges();
  for (int64_t e = 0; e < m; ++e) src[e] = VECTOR(graph_.from)[e], dst[e] = VECTOR(graph_.to)[e];
}

std::vector<uint8_t> KnowledgeGraph::node_kind() const { std::shared_lock lock(mutex_); return node_kind_; }
std::vector<uint8_t> KnowledgeGraph::edge_kind() const { std::shared_lock lock(mutex_); return edge_kind_; }
std::vector<int64_t> KnowledgeGraph::node_doc() const {
  std::shared_lock lock(mutex_);
  return std::vector<int64_t>(node_doc_.begin(), node_doc_.end());
}
std::vector<int64_t> KnowledgeGraph::alias_of() const {
  std::shared_lock lock(mutex_);
  return std::vector<int64_t>(alias_of_.begin(), alias_of_.end());
}
std::vector<float> KnowledgeGraph::node_weight() const { std::shared_lock lock(mutex_); return read_weights(node_weight_, n_nodes()); }
std::vector<float> KnowledgeGraph::edge_weight() const { std::shared_lock lock(mutex_); return read_weights(edge_weight_, n_edges()); }

int64_t KnowledgeGraph::memory_bytes() const {
  std::shared_lock lock(mutex_);
  auto vec = [](const igraph_vector_int_t& v) { return static_cast<int64_t>(igraph_vector_int_capacity(&v) * sizeof(igraph_integer_t)); };
  int64_t bytes = vec(graph_.from) + vec(graph_.to) + vec(graph_.oi) + vec(graph_.ii) + vec(graph_.os) + vec(graph_.is);
  bytes += node_kind_.capacity() + edge_kind_.capacity() + 4 * node_doc_.capacity() + 4 * node_weight_.capacity() +
           4 * edge_weight_.capacity() + 4 * alias_of_.capacity() + 8 * (group_offsets_.capacity() + group_members_.capacity()) +
           hub_lists_.memory_bytes();
  return bytes;
}

}  // namespace colgraph
