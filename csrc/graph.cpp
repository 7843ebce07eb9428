#include "graph.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "igraph_runtime.hpp"
#include "parallel.hpp"

namespace colgraph {
namespace {

constexpr uint8_t kUnseen = 0, kReached = 1, kDropped = 2, kCandidate = 3;
constexpr float kNoScore = std::numeric_limits<float>::quiet_NaN();

std::string at(const char* what, int64_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

}  // namespace

struct QueryResult {
  std::vector<int64_t> nodes, seed, parent, parent_edge, edges;
  std::vector<int32_t> hop;
  std::vector<float> score;
  void clear() {
    nodes.clear(), seed.clear(), parent.clear(), parent_edge.clear(), edges.clear(), hop.clear(), score.clear();
  }
  void reserve(size_t n) {
    if (n <= nodes.capacity()) return;
    n = std::max(n, 2 * nodes.capacity());
    nodes.reserve(n), seed.reserve(n), parent.reserve(n), parent_edge.reserve(n), hop.reserve(n), score.reserve(n);
  }
};

struct RankKey {
  float score;
  int64_t node, index;
};

struct Candidate {
  int64_t node, parent, edge, seed;
  float score, unit_score;  // the node's own, and the best of its alias unit
  int64_t unit_size;
};

// Per-thread working memory, sized to the graph on first use and reset through "touched"
// lists, so a query costs O(nodes it touches), not O(graph). The growing buffers (candidates,
// ranking keys, the result being built) are kept between queries and calls: fresh pages cost
// more than the traversal on small frontiers.
struct ExpandScratch {
  std::vector<Candidate> cand;
  std::vector<RankKey> keys;
  std::vector<uint8_t> keep_flag;
  std::vector<int64_t> reached, sort_buffer;
  QueryResult staging;
  std::vector<uint8_t> state;
  std::vector<int64_t> state_touched;
  std::vector<float> sparse_score;
  std::vector<int64_t> score_touched;
  std::vector<uint8_t> doc_ok;
  std::vector<int64_t> doc_touched;

  void ensure(int64_t n, int64_t n_docs) {
    if (static_cast<int64_t>(state.size()) < n) {
      state.assign(n, kUnseen);
      sparse_score.assign(n, -std::numeric_limits<float>::infinity());
    }
    if (static_cast<int64_t>(doc_ok.size()) < n_docs) doc_ok.assign(n_docs, 0);
  }
  void reset() {
    for (int64_t v : state_touched) state[v] = kUnseen;
    for (int64_t v : score_touched) sparse_score[v] = -std::numeric_limits<float>::infinity();
    for (int64_t d : doc_touched) doc_ok[d] = 0;
    state_touched.clear(), score_touched.clear(), doc_touched.clear();
  }
};

ScratchPool::ScratchPool() = default;
ScratchPool::~ScratchPool() = default;

std::unique_ptr<ExpandScratch> ScratchPool::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) return std::make_unique<ExpandScratch>();
  auto s = std::move(free_.back());
  free_.pop_back();
  return s;
}

void ScratchPool::release(std::unique_ptr<ExpandScratch> s) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(s));
}

namespace {

// Sorts non-negative ids below `bound` ascending. Least-significant-digit radix sort, 11 bits
// per pass: a query's induced subgraph lists tens of thousands of edges, where a comparison
// sort costs more than finding them. Small inputs go to std::sort.
void sort_ids(std::vector<int64_t>& ids, int64_t bound, std::vector<int64_t>& buffer) {
  const size_t n = ids.size();
  if (n < 1024) {
    std::sort(ids.begin(), ids.end());
    return;
  }
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < bound) ++bits;
  buffer.resize(n);
  int64_t* src = ids.data();
  int64_t* dst = buffer.data();
  size_t count[kBuckets];
  for (int shift = 0; shift < bits; shift += kBits) {
    std::fill(count, count + kBuckets, 0);
    for (size_t i = 0; i < n; ++i) ++count[(src[i] >> shift) & (kBuckets - 1)];
    size_t total = 0;
    for (size_t b = 0; b < kBuckets; ++b) total += std::exchange(count[b], total);
    for (size_t i = 0; i < n; ++i) dst[count[(src[i] >> shift) & (kBuckets - 1)]++] = src[i];
    std::swap(src, dst);
  }
  if (src != ids.data()) std::copy(src, src + n, ids.data());
}

// A worker's borrowed scratch, returned to the pool when the worker ends.
struct ScratchLease {
  ScratchPool* pool = nullptr;
  std::unique_ptr<ExpandScratch> scratch;
  ExpandScratch& get(ScratchPool& p) {
    if (!scratch) pool = &p, scratch = p.acquire();
    return *scratch;
  }
  ~ScratchLease() {
    if (scratch) {
      scratch->reset();
      pool->release(std::move(scratch));
    }
  }
};

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
  node_kind_.reserve(old_n + count), node_doc_.reserve(old_n + count), alias_of_.reserve(old_n + count);
  if (!node_weight_.empty()) node_weight_.reserve(old_n + count);
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
  edge_kind_.reserve(old_m + count);
  if (!edge_weight_.empty()) edge_weight_.reserve(old_m + count);
  if (old_m == 0) {
    bulk_load_edges(count, src, dst);
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
  rebuild_neighbours();
}

void KnowledgeGraph::rebuild_neighbours() {
  const int64_t n = n_nodes(), m = n_edges();
  const igraph_integer_t *from = VECTOR(graph_.from), *to = VECTOR(graph_.to), *oi = VECTOR(graph_.oi),
                         *ii = VECTOR(graph_.ii), *os = VECTOR(graph_.os), *is = VECTOR(graph_.is);
  neighbours_.resize(2 * m);
  int32_t* out = neighbours_.data();
  for (int64_t u = 0; u < n; ++u) {
    for (igraph_integer_t k = os[u]; k < os[u + 1]; ++k) *out++ = static_cast<int32_t>(to[oi[k]]);
    for (igraph_integer_t k = is[u]; k < is[u + 1]; ++k) *out++ = static_cast<int32_t>(from[ii[k]]);
  }
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
  igraph_integer_t* from = VECTOR(graph_.from);
  igraph_integer_t* to = VECTOR(graph_.to);
  std::copy(src, src + m, from);
  std::copy(dst, dst + m, to);
  order_edges(from, to, n, m, VECTOR(graph_.oi), VECTOR(graph_.os));
  order_edges(to, from, n, m, VECTOR(graph_.ii), VECTOR(graph_.is));
  igraph_invalidate_cache(&graph_);
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
    if (group_of[v] < -1 || group_of[v] >= kInt32Max) throw std::invalid_argument(at("alias_group", v) + ": expected a group id in [0, 2^31) or -1");
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
           4 * neighbours_.capacity();
  return bytes;
}

Expansion KnowledgeGraph::expand(int64_t nq, CsrView seeds, ScoresView scores, CsrView docs,
                                 const ExpandOptions& opt, int num_threads) const {
  std::shared_lock lock(mutex_);
  const int64_t n = n_nodes();
  if (opt.hops < 0) throw std::invalid_argument("hops: expected >= 0");
  if (opt.min_keep < 0) throw std::invalid_argument("min_keep: expected >= 0");
  if (std::isnan(opt.threshold)) throw std::invalid_argument("threshold: expected a number, got NaN");
  for (int64_t i = 0; i < seeds.offsets[nq]; ++i)
    if (seeds.values[i] < 0 || seeds.values[i] >= n) throw std::invalid_argument(at("seeds", i) + " = " + std::to_string(seeds.values[i]) + ": expected a node id in [0, " + std::to_string(n) + ")");
  if (scores.sparse_offsets)
    for (int64_t i = 0; i < scores.sparse_offsets[nq]; ++i) {
      if (scores.sparse_nodes[i] < 0 || scores.sparse_nodes[i] >= n) throw std::invalid_argument(at("score_nodes", i) + ": expected a node id in [0, " + std::to_string(n) + ")");
      if (std::isnan(scores.sparse_values[i])) throw std::invalid_argument(at("score_values", i) + ": expected a number, got NaN");
    }

  const igraph_integer_t* to = VECTOR(graph_.to);
  const igraph_integer_t* oi = VECTOR(graph_.oi);
  const igraph_integer_t* ii = VECTOR(graph_.ii);
  const igraph_integer_t* os = VECTOR(graph_.os);
  const igraph_integer_t* is = VECTOR(graph_.is);
  const bool use_out = opt.direction != Direction::In, use_in = opt.direction != Direction::Out;
  const bool all_edge_kinds = opt.edge_kind_mask == ~0ull, all_node_kinds = opt.node_kind_mask == ~0ull;
  const bool merge = opt.merge_aliases && !group_members_.empty();
  const int64_t n_docs = max_doc_ + 1, m_edges = n_edges();
  std::vector<QueryResult> results(nq);

  parallel_tasks<ScratchLease>(nq, num_threads, [&](int64_t q, ScratchLease& lease) {
    ExpandScratch& s = lease.get(scratch_pool_);
    s.ensure(n, n_docs);
    QueryResult& r = s.staging;
    r.clear();
    const bool restrict_docs = docs.offsets != nullptr;
    if (restrict_docs)
      for (int64_t i = docs.offsets[q]; i < docs.offsets[q + 1]; ++i) {
        const int64_t d = docs.values[i];
        if (d >= 0 && d < n_docs && !s.doc_ok[d]) s.doc_ok[d] = 1, s.doc_touched.push_back(d);
      }
    if (scores.sparse_offsets)
      for (int64_t i = scores.sparse_offsets[q]; i < scores.sparse_offsets[q + 1]; ++i) {
        const int64_t v = scores.sparse_nodes[i];
        s.sparse_score[v] = scores.sparse_values[i];
        s.score_touched.push_back(v);
      }
    bool saw_nan = false;
    int64_t nan_node = -1;
    auto score_of = [&](int64_t v) -> float {
      float x;
      if (scores.dense) x = scores.dense[q * n + v];
      else if (scores.sparse_offsets) x = s.sparse_score[v];
      else return kNoScore;
      if (std::isnan(x) && !saw_nan) saw_nan = true, nan_node = v;
      return x;
    };
    auto allowed = [&](int64_t v) {
      return (all_node_kinds || ((opt.node_kind_mask >> node_kind_[v]) & 1u)) && (!restrict_docs || s.doc_ok[node_doc_[v]]);
    };
    auto set_state = [&](int64_t v, uint8_t st) {
      if (s.state[v] == kUnseen) s.state_touched.push_back(v);
      s.state[v] = st;
    };
    auto admit = [&](int64_t v, int32_t hop, int64_t seed, int64_t parent, int64_t edge, float score) {
      set_state(v, kReached);
      r.nodes.push_back(v), r.hop.push_back(hop), r.seed.push_back(seed);
      r.parent.push_back(parent), r.parent_edge.push_back(edge), r.score.push_back(score);
    };
    // Admits v and, when merging, the allowed members of its alias group that are not yet reached.
    auto admit_unit = [&](int64_t v, int32_t hop, int64_t seed, int64_t parent, int64_t edge, float score) {
      admit(v, hop, seed, parent, edge, score);
      if (merge && alias_of_[v] >= 0) {
        const int64_t g = alias_of_[v];
        for (int64_t k = group_offsets_[g]; k < group_offsets_[g + 1]; ++k) {
          const int64_t m = group_members_[k];
          if (m != v && s.state[m] != kReached && allowed(m)) admit(m, hop, seed, v, -1, score_of(m));
        }
      }
    };
    auto edge_ok = [&](int64_t e) { return all_edge_kinds || ((opt.edge_kind_mask >> edge_kind_[e]) & 1u); };

    // Hop 0: the seeds, in the order given (repeats and alias siblings of earlier seeds skipped).
    for (int64_t i = seeds.offsets[q]; i < seeds.offsets[q + 1]; ++i) {
      const int64_t v = seeds.values[i];
      if (s.state[v] != kReached) admit_unit(v, 0, v, -1, -1, score_of(v));
    }
    int64_t frontier_begin = 0, frontier_end = static_cast<int64_t>(r.nodes.size());
    std::vector<Candidate>& cand = s.cand;
    std::vector<RankKey>& keys = s.keys;
    std::vector<uint8_t>& keep_flag = s.keep_flag;

    for (int32_t hop = 1; hop <= opt.hops && frontier_begin < frontier_end; ++hop) {
      cand.clear();
      // Scan: a neighbour becomes a candidate the first time a frontier node reaches it (out-
      // edges before in-edges); its parent edge is the lowest-id allowed edge of that run, so
      // the result does not depend on how igraph orders parallel edges. Scores are read in a
      // separate pass below, where the loads do not wait on one another.
      for (int64_t f = frontier_begin; f < frontier_end; ++f) {
        const int64_t u = r.nodes[f], seed_u = r.seed[f];
        const igraph_integer_t out_deg = os[u + 1] - os[u], in_deg = is[u + 1] - is[u];
        const int32_t* nb = neighbours_.data() + os[u] + is[u];
        for (int block = 0; block < 2; ++block) {
          if (block == 0 ? !use_out : !use_in) continue;
          const igraph_integer_t* ids = block == 0 ? oi + os[u] : ii + is[u];
          const int32_t* row = block == 0 ? nb : nb + out_deg;
          const igraph_integer_t len = block == 0 ? out_deg : in_deg;
          for (igraph_integer_t j = 0; j < len; ++j) {
            const int64_t v = row[j];
            if (s.state[v] != kUnseen) continue;
            int64_t e = ids[j];
            if (!edge_ok(e) || !allowed(v)) continue;
            for (igraph_integer_t k = j + 1; k < len && row[k] == v; ++k)  // parallel edges sit together
              if (ids[k] < e && edge_ok(ids[k])) e = ids[k];
            set_state(v, kCandidate);
            Candidate c{v, u, e, seed_u, kNoScore, kNoScore, 1};
            if (merge && alias_of_[v] >= 0) {  // the whole alias group rides on its first-found member
              const int64_t g = alias_of_[v];
              for (int64_t k = group_offsets_[g]; k < group_offsets_[g + 1]; ++k) {
                const int64_t m = group_members_[k];
                if (m == v || s.state[m] != kUnseen || !allowed(m)) continue;
                set_state(m, kCandidate);
                ++c.unit_size;
              }
            }
            cand.push_back(c);
          }
        }
      }
      const int64_t nc = static_cast<int64_t>(cand.size());
      if (scores.present()) {
        for (Candidate& c : cand) c.score = c.unit_score = score_of(c.node);
        if (merge)
          for (Candidate& c : cand) {
            if (alias_of_[c.node] < 0 || c.unit_size == 1) continue;
            const int64_t g = alias_of_[c.node];
            for (int64_t k = group_offsets_[g]; k < group_offsets_[g + 1]; ++k) {
              const int64_t m = group_members_[k];
              if (m != c.node && s.state[m] == kCandidate && allowed(m)) c.unit_score = std::fmax(c.unit_score, score_of(m));
            }
          }
      }
      if (saw_nan) break;
      // Relevance: keep those with score > threshold, topped up to min_keep with the best of
      // the rest (score desc, node asc). If the budget cannot hold every kept unit, the best
      // are taken in rank order up to the first that does not fit, and the search stops.
      // Kept nodes are admitted in discovery order, so the common case needs no sort at all.
      keep_flag.assign(nc, scores.present() ? 0 : 1);
      auto better = [](const RankKey& a, const RankKey& b) {
        return a.score != b.score ? a.score > b.score : a.node < b.node;
      };
      if (scores.present()) {
        int64_t passing = 0;
        for (int64_t i = 0; i < nc; ++i) passing += keep_flag[i] = cand[i].unit_score > opt.threshold;
        const int64_t top_up = std::min(opt.min_keep, nc) - passing;
        if (top_up > 0) {
          keys.clear();
          for (int64_t i = 0; i < nc; ++i)
            if (!keep_flag[i]) keys.push_back(RankKey{cand[i].unit_score, cand[i].node, i});
          std::nth_element(keys.begin(), keys.begin() + top_up - 1, keys.end(), better);
          for (int64_t i = 0; i < top_up; ++i) keep_flag[keys[i].index] = 1;
        }
      }
      bool full = false;
      if (opt.budget >= 0) {
        int64_t kept_size = 0;
        for (int64_t i = 0; i < nc; ++i) kept_size += keep_flag[i] ? cand[i].unit_size : 0;
        int64_t room = opt.budget - static_cast<int64_t>(r.nodes.size());
        if (kept_size > room) {
          full = true;
          keys.clear();
          for (int64_t i = 0; i < nc; ++i)
            if (keep_flag[i]) keys.push_back(RankKey{cand[i].unit_score, cand[i].node, i}), keep_flag[i] = 0;
          if (scores.present()) std::sort(keys.begin(), keys.end(), better);  // else: discovery order
          for (const RankKey& k : keys) {
            if (cand[k.index].unit_size > room) break;
            room -= cand[k.index].unit_size;
            keep_flag[k.index] = 1;
          }
        }
      }
      frontier_begin = static_cast<int64_t>(r.nodes.size());
      r.reserve(r.nodes.size() + nc);
      for (int64_t i = 0; i < nc; ++i) {
        const Candidate& c = cand[i];
        if (keep_flag[i]) {
          admit_unit(c.node, hop, c.seed, c.parent, c.edge, c.score);
        } else {
          set_state(c.node, kDropped);
          if (merge && alias_of_[c.node] >= 0) {
            const int64_t g = alias_of_[c.node];
            for (int64_t k = group_offsets_[g]; k < group_offsets_[g + 1]; ++k)
              if (s.state[group_members_[k]] == kCandidate) s.state[group_members_[k]] = kDropped;
          }
        }
      }
      frontier_end = static_cast<int64_t>(r.nodes.size());
      if (full) break;
    }
    if (saw_nan) {
      s.reset();
      throw std::invalid_argument("scores: NaN for node " + std::to_string(nan_node) + " in query " + std::to_string(q));
    }
    // Induced subgraph: every allowed-kind edge whose two ends were reached. A node's out-edges
    // are sorted by target, so for a hub it is cheaper to look each reached node up in its run
    // (|R| log deg) than to scan the run (deg).
    if (opt.with_edges) {
      std::vector<int64_t>& reached = s.reached;
      reached.assign(r.nodes.begin(), r.nodes.end());
      std::sort(reached.begin(), reached.end());
      const double r_size = static_cast<double>(reached.size());
      auto take = [&](int64_t e) {
        if (edge_ok(e)) r.edges.push_back(e);
      };
      for (int64_t u : r.nodes) {
        const igraph_integer_t lo = os[u], hi = os[u + 1], deg = hi - lo;
        if (static_cast<double>(deg) > r_size * (1.0 + std::log2(static_cast<double>(deg) + 1.0))) {
          igraph_integer_t k = lo;
          for (int64_t v : reached) {
            igraph_integer_t a = k, b = hi;  // first k in [a, hi) with to[oi[k]] >= v
            while (a < b) {
              const igraph_integer_t mid = a + (b - a) / 2;
              if (to[oi[mid]] < v) a = mid + 1; else b = mid;
            }
            for (k = a; k < hi && to[oi[k]] == v; ++k) take(oi[k]);
          }
        } else {
          const int32_t* nb = neighbours_.data() + os[u] + is[u];  // out-neighbours, in oi order
          for (igraph_integer_t j = 0; j < deg; ++j)
            if (s.state[nb[j]] == kReached) take(oi[lo + j]);
        }
      }
      sort_ids(r.edges, m_edges, s.sort_buffer);
    }
    results[q] = r;  // exact-size copy; the staging buffers stay with the thread
    s.reset();
  });

  Expansion out;
  out.node_offsets.assign(1, 0), out.edge_offsets.assign(1, 0);
  for (const QueryResult& r : results) {
    out.node_offsets.push_back(out.node_offsets.back() + static_cast<int64_t>(r.nodes.size()));
    out.edge_offsets.push_back(out.edge_offsets.back() + static_cast<int64_t>(r.edges.size()));
  }
  const auto total = static_cast<size_t>(out.node_offsets.back());
  out.nodes.reserve(total), out.seed.reserve(total), out.parent.reserve(total);
  out.parent_edge.reserve(total), out.hop.reserve(total), out.score.reserve(total);
  out.edges.reserve(static_cast<size_t>(out.edge_offsets.back()));
  for (QueryResult& r : results) {
    out.nodes.insert(out.nodes.end(), r.nodes.begin(), r.nodes.end());
    out.seed.insert(out.seed.end(), r.seed.begin(), r.seed.end());
    out.parent.insert(out.parent.end(), r.parent.begin(), r.parent.end());
    out.parent_edge.insert(out.parent_edge.end(), r.parent_edge.begin(), r.parent_edge.end());
    out.hop.insert(out.hop.end(), r.hop.begin(), r.hop.end());
    out.score.insert(out.score.end(), r.score.begin(), r.score.end());
    out.edges.insert(out.edges.end(), r.edges.begin(), r.edges.end());
  }
  return out;
}

}  // namespace colgraph
