// Batched, relevance-filtered multi-source BFS over a KnowledgeGraph (rules: see the docstring
// of colgraph_engine/graph/reference.py, the oracle this must match node for node).
//
// Per query and hop: scan the frontier's adjacency and collect the candidates (neighbours seen
// for the first time), read their scores, keep those that pass (topped up to min_keep, cut to
// the budget) and admit them in discovery order as the next frontier. Queries run on worker
// threads; each worker appends its queries' results to its own arena, and one parallel copy
// at the end lays them out in query order.
//
// Where the time goes on a large graph is memory, not arithmetic: one score per candidate (a
// random read of a row of the [Nq, n] score matrix; on the 1M-node benchmark these reads alone
// take about a third of the time), the visited test of every scanned neighbour, and writing
// the result. So the visited state is two bit sets (L2-resident up to millions of nodes), long
// adjacency lists are read from sequential copies (HubLists), the endpoints of the other lists
// are read ahead in one overlapping pass, and the hot loops append without branches.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "graph.hpp"
#include "huge_pages.hpp"
#include "parallel.hpp"

namespace colgraph {
namespace {

constexpr float kNoScore = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();  // an unscored node
// Reads of to[e] / from[e] for uncopied lists are prefetched this many entries ahead: more of
// them are then in flight than the out-of-order window alone keeps (about 12% off the induced
// edges at l = 2 on the benchmark graph, measured in a C++ harness).
constexpr size_t kReadAhead = 16;

// One bit per node.
struct NodeBits {
  std::vector<uint64_t> words;
  bool test(int64_t v) const { return (words[v >> 6] >> (v & 63)) & 1u; }
  void set(int64_t v) { words[v >> 6] |= uint64_t{1} << (v & 63); }
  void clear(int64_t v) { words[v >> 6] &= ~(uint64_t{1} << (v & 63)); }
};

struct RankKey {
  float score;
  int64_t node, index;
};

// A growable array on malloc/realloc for trivially copyable T: no element is initialised, and
// glibc grows a large block in place or by remapping its pages (mremap), where a vector would
// allocate anew and copy: a worker's results can reach gigabytes.
template <class T>
class RawColumn {
 public:
  RawColumn() = default;
  ~RawColumn() { std::free(data_); }
  RawColumn(const RawColumn&) = delete;
  RawColumn& operator=(const RawColumn&) = delete;
  RawColumn(RawColumn&& o) noexcept : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
  RawColumn& operator=(RawColumn&& o) noexcept {
    std::swap(data_, o.data_), std::swap(capacity_, o.capacity_);
    return *this;
  }
  void reserve(size_t n) {
    if (n <= capacity_) return;
    void* p = std::realloc(data_, n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(p), capacity_ = n;
    advise_huge_pages(data_, n * sizeof(T), false);  // the new part is not written yet
  }
  size_t capacity() const { return capacity_; }
  size_t bytes() const { return capacity_ * sizeof(T); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

// A RawColumn with a live count: capacity grows geometrically and is kept between queries, so a
// loop that made room first appends through a plain pointer (the hot loops below append
// branch-free).
template <class T>
struct Buf {
  RawColumn<T> v;
  size_t size = 0;
  void room(size_t extra) {
    if (size + extra > v.capacity()) v.reserve(std::max(size + extra, 2 * v.capacity()));
  }
  void push(T x) {
    room(1);
    v[size++] = x;
  }
  T* data() { return v.data(); }
  const T* data() const { return v.data(); }
  T& operator[](size_t i) { return v[i]; }
  const T& operator[](size_t i) const { return v[i]; }
};

// The results of the queries a worker ran, back to back (query ranges in QuerySpan).
struct Arena {
  RawColumn<int64_t> nodes, seed, parent, parent_edge;
  RawColumn<int32_t> hop;
  RawColumn<float> score;
  size_t size = 0;  // live entries of the six node columns
  Buf<int64_t> edges;
  void room(size_t extra) {
    if (size + extra <= nodes.capacity()) return;
    const size_t cap = std::max(size + extra, 2 * nodes.capacity());
    nodes.reserve(cap), seed.reserve(cap), parent.reserve(cap), parent_edge.reserve(cap), hop.reserve(cap), score.reserve(cap);
  }
  void push(int64_t v, int32_t h, int64_t sd, int64_t p, int64_t e, float sc) {
    room(1);
    nodes[size] = v, hop[size] = h, seed[size] = sd, parent[size] = p, parent_edge[size] = e, score[size] = sc;
    ++size;
  }
  size_t bytes() const {
    return nodes.bytes() + seed.bytes() + parent.bytes() + parent_edge.bytes() + hop.bytes() + score.bytes() + edges.v.bytes();
  }
};

struct QuerySpan {
  int worker = 0;
  int64_t node_begin = 0, node_end = 0, edge_begin = 0, edge_end = 0;
};

// Sorts non-negative ids below `bound` ascending. Least-significant-digit radix sort, 11 bits
// per pass: a query's induced subgraph lists tens of thousands of edges, where a comparison
// sort costs more than finding them. Small inputs go to std::sort.
void sort_ids(int64_t* ids, size_t n, int64_t bound, std::vector<int64_t>& buffer) {
  if (n < 1024) {
    std::sort(ids, ids + n);
    return;
  }
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < bound) ++bits;
  buffer.resize(n);
  int64_t* src = ids;
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
  if (src != ids) std::copy(src, src + n, ids);
}

template <class Out, class In>
void copy_range(Out& out, const In& in, int64_t begin, int64_t end, int64_t to) {
  if (end > begin) std::memcpy(out.data() + to, in.data() + begin, sizeof(in[0]) * static_cast<size_t>(end - begin));
}

}  // namespace

// Per-worker working memory, sized to the graph on first use and reset through the list of
// nodes it marked, so a query costs O(nodes it touches), not O(graph). Buffers keep their
// capacity between queries and calls: fresh pages cost more than a small traversal.
struct ExpandScratch {
  NodeBits seen;      // reached, dropped, or a candidate of the current hop
  NodeBits reached;   // admitted to the result
  Buf<int64_t> marked;  // nodes set in `seen`, for the reset
  // Candidates of the current hop, in discovery order.
  Buf<int64_t> cand_node, cand_edge;
  Buf<int32_t> kept;       // indices of the candidates kept
  Buf<int64_t> pending_edge, pending_node;  // staged reads of lists without a copy
  Buf<int32_t> cand_from;  // index (within the query's result) of the frontier node that found it
  Buf<float> cand_score;
  std::vector<float> unit_score;
  std::vector<int64_t> unit_size, unit_first, unit_members;  // alias merging only
  std::vector<uint8_t> keep;
  std::vector<RankKey> keys;
  std::vector<int64_t> reached_sorted, sort_buffer;
  std::vector<float> sparse_score;
  std::vector<int64_t> score_touched;
  std::vector<uint8_t> doc_ok;
  std::vector<int64_t> doc_touched;
  Arena arena;

  void ensure(int64_t n, int64_t n_docs) {
    const size_t words = static_cast<size_t>((n + 63) / 64);
    if (seen.words.size() < words) {
      seen.words.assign(words, 0);
      reached.words.assign(words, 0);
      sparse_score.assign(n, -std::numeric_limits<float>::infinity());
    }
    if (static_cast<int64_t>(doc_ok.size()) < n_docs) doc_ok.assign(n_docs, 0);
  }
  // Frees buffers a large call grew beyond kKeepBytes: kept, they would hold a call's peak
  // (gigabytes for a deep unfiltered expansion) for the graph's lifetime.
  static constexpr size_t kKeepBytes = size_t{64} << 20;
  template <class T>
  static void trim_vector(std::vector<T>& v) {
    if (v.capacity() * sizeof(T) > kKeepBytes) std::vector<T>().swap(v);
  }
  template <class T>
  static void trim_buf(Buf<T>& b) {
    if (b.v.bytes() > kKeepBytes) b.v = RawColumn<T>();
  }
  void trim() {
    if (arena.bytes() > kKeepBytes) arena = Arena{};
    for (Buf<int64_t>* b : {&marked, &cand_node, &cand_edge, &pending_edge, &pending_node}) trim_buf(*b);
    trim_buf(cand_from), trim_buf(kept), trim_buf(cand_score);
    trim_vector(reached_sorted), trim_vector(sort_buffer);
  }
  void reset() {
    if (marked.size > seen.words.size() / 8) {  // cheaper to wipe the words than to visit each bit
      std::fill(seen.words.begin(), seen.words.end(), 0);
      std::fill(reached.words.begin(), reached.words.end(), 0);
    } else {
      for (size_t i = 0; i < marked.size; ++i) seen.clear(marked[i]), reached.clear(marked[i]);
    }
    for (int64_t v : score_touched) sparse_score[v] = -std::numeric_limits<float>::infinity();
    for (int64_t d : doc_touched) doc_ok[d] = 0;
    marked.size = 0, score_touched.clear(), doc_touched.clear();
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

  const igraph_integer_t *from = VECTOR(graph_.from), *to = VECTOR(graph_.to), *oi = VECTOR(graph_.oi),
                         *ii = VECTOR(graph_.ii), *os = VECTOR(graph_.os), *is = VECTOR(graph_.is);
  const bool use_out = opt.direction != Direction::In, use_in = opt.direction != Direction::Out;
  const bool all_edge_kinds = opt.edge_kind_mask == ~0ull, all_node_kinds = opt.node_kind_mask == ~0ull;
  const bool merge = opt.merge_aliases && !group_members_.empty();
  const bool restrict_docs = docs.offsets != nullptr;
  const bool filtered = !all_edge_kinds || !all_node_kinds || restrict_docs;
  const int64_t n_docs = max_doc_ + 1, m_edges = n_edges();

  const int workers = worker_count(nq, num_threads);
  std::vector<std::unique_ptr<ExpandScratch>> scratch(workers);
  for (auto& s : scratch) s = scratch_pool_.acquire(), s->ensure(n, n_docs), s->arena.size = 0, s->arena.edges.size = 0;
  struct ReturnScratch {  // hands the scratch back to the pool however expand() ends
    ScratchPool& pool;
    std::vector<std::unique_ptr<ExpandScratch>>& scratch;
    ~ReturnScratch() {
      for (auto& s : scratch) s->reset(), s->trim(), pool.release(std::move(s));
    }
  } give_back{scratch_pool_, scratch};
  std::vector<QuerySpan> spans(nq);

  parallel_workers(nq, workers, [&](int64_t q, int worker) {
    ExpandScratch& s = *scratch[worker];
    Arena& A = s.arena;
    const int64_t base = static_cast<int64_t>(A.size);
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
    const float* dense_row = scores.dense ? scores.dense + q * n : nullptr;
    const float* sparse_row = scores.sparse_offsets ? s.sparse_score.data() : nullptr;
    const bool have_scores = scores.present();
    int64_t nan_node = -1;  // first node whose score read NaN
    auto score_of = [&](int64_t v) -> float {
      const float x = dense_row ? dense_row[v] : sparse_row ? sparse_row[v] : kNoScore;
      if (have_scores && std::isnan(x) && nan_node < 0) nan_node = v;
      return x;
    };
    auto allowed = [&](int64_t v) {
      return (all_node_kinds || ((opt.node_kind_mask >> node_kind_[v]) & 1u)) && (!restrict_docs || s.doc_ok[node_doc_[v]]);
    };
    auto edge_ok = [&](int64_t e) { return all_edge_kinds || ((opt.edge_kind_mask >> edge_kind_[e]) & 1u); };
    auto mark_seen = [&](int64_t v) {
      s.seen.set(v);
      s.marked.push(v);
    };
    auto admit = [&](int64_t v, int32_t hop, int64_t seed, int64_t parent, int64_t edge, float score) {
      if (!s.seen.test(v)) mark_seen(v);
      s.reached.set(v);
      A.push(v, hop, seed, parent, edge, score);
    };
    // Admits v and, when merging, the allowed members of its alias group not yet reached.
    auto admit_unit = [&](int64_t v, int32_t hop, int64_t seed, int64_t parent, int64_t edge, float score) {
      admit(v, hop, seed, parent, edge, score);
      if (merge && alias_of_[v] >= 0) {
        const int64_t g = alias_of_[v];
        for (int64_t k = group_offsets_[g]; k < group_offsets_[g + 1]; ++k) {
          const int64_t m = group_members_[k];
          if (m != v && !s.reached.test(m) && allowed(m)) admit(m, hop, seed, v, -1, score_of(m));
        }
      }
    };

    // Hop 0: the seeds, in the order given (repeats and alias siblings of earlier seeds skipped).
    for (int64_t i = seeds.offsets[q]; i < seeds.offsets[q + 1]; ++i) {
      const int64_t v = seeds.values[i];
      if (!s.reached.test(v)) admit_unit(v, 0, v, -1, -1, score_of(v));
    }
    int64_t frontier_begin = 0, frontier_end = static_cast<int64_t>(A.size) - base;

    for (int32_t hop = 1; hop <= opt.hops && frontier_begin < frontier_end && nan_node < 0; ++hop) {
      // ---- Scan. A neighbour becomes a candidate the first time a frontier node reaches it
      // (out-edges before in-edges); that node is its parent (see the scanners for the edge).
      size_t bound = 0;  // most candidates this hop can produce: room is made once
      for (int64_t f = frontier_begin; f < frontier_end; ++f) {
        const int64_t u = A.nodes[base + f];
        bound += static_cast<size_t>((use_out ? os[u + 1] - os[u] : 0) + (use_in ? is[u + 1] - is[u] : 0));
      }
      s.cand_node.size = s.cand_edge.size = s.cand_from.size = 0;
      s.cand_node.room(bound), s.cand_edge.room(bound), s.cand_from.room(bound);
      s.unit_size.clear(), s.unit_first.clear(), s.unit_members.clear();
      int64_t* cn = s.cand_node.data();
      int64_t* ce = s.cand_edge.data();
      int32_t* cf = s.cand_from.data();
      uint64_t* seen_words = s.seen.words.data();
      size_t nc = 0;
      // Without kind/document filters or alias units, a neighbour is a candidate iff its seen
      // bit was clear: written unconditionally and counted by that bit, with no branch to
      // mispredict (about a third of a hub's neighbours were seen already).
      // Both scanners read one out- or in-list through `node_at(k)`, `edge_at(k)` (k < len).
      // igraph sorts a list by neighbour id, so parallel edges form a run; the parent edge is
      // the lowest allowed id of the run where the candidate is found (igraph does not order a
      // run by edge id once edges are added incrementally).
      //
      // Without kind/document filters or alias units: a neighbour is a candidate iff its seen
      // bit was clear. It is written unconditionally and counted by that bit, with no branch to
      // mispredict (about a third of a hub's neighbours were seen already), and the seen word
      // of the current 64-id range is kept in a register.
      auto scan_fast = [&](igraph_integer_t len, auto&& node_at, auto&& edge_at, int32_t f) __attribute__((always_inline)) {
        int64_t cur_index = -1, prev_v = -1, run_cand = -1;
        uint64_t cur = 0;
        for (igraph_integer_t k = 0; k < len; ++k) {
          const int64_t v = node_at(k), e = edge_at(k);
          if (v == prev_v) {  // a parallel edge
            if (run_cand >= 0) ce[run_cand] = std::min(ce[run_cand], e);
            continue;
          }
          prev_v = v;
          const int64_t index = v >> 6;
          if (index != cur_index) {
            if (cur_index >= 0) seen_words[cur_index] = cur;
            cur_index = index, cur = seen_words[index];
          }
          const uint64_t bit = uint64_t{1} << (v & 63);
          const size_t fresh = (cur & bit) == 0;
          cur |= bit;
          cn[nc] = v, ce[nc] = e, cf[nc] = f;
          run_cand = fresh ? static_cast<int64_t>(nc) : -1;
          nc += fresh;
        }
        if (cur_index >= 0) seen_words[cur_index] = cur;
      };
      auto scan_filtered = [&](igraph_integer_t len, auto&& node_at, auto&& edge_at, int32_t f) {
        int64_t prev_v = -1, run_cand = -1;
        for (igraph_integer_t k = 0; k < len; ++k) {
          const int64_t v = node_at(k), e = edge_at(k);
          if (v == prev_v && run_cand >= 0) {
            if (e < ce[run_cand] && edge_ok(e)) ce[run_cand] = e;
            continue;
          }
          prev_v = v, run_cand = -1;
          if (s.seen.test(v) || !edge_ok(e) || !allowed(v)) continue;  // a later edge of the run may be allowed
          seen_words[v >> 6] |= uint64_t{1} << (v & 63);
          run_cand = static_cast<int64_t>(nc);
          cn[nc] = v, ce[nc] = e, cf[nc] = f, ++nc;
          if (merge) {  // the whole alias group rides on its first-found member
            int64_t size = 1;
            s.unit_first.push_back(static_cast<int64_t>(s.unit_members.size()));
            if (alias_of_[v] >= 0) {
              const int64_t g = alias_of_[v];
              for (int64_t j = group_offsets_[g]; j < group_offsets_[g + 1]; ++j) {
                const int64_t m = group_members_[j];
                if (m == v || s.seen.test(m) || !allowed(m)) continue;
                mark_seen(m);
                s.unit_members.push_back(m);
                ++size;
              }
            }
            s.unit_size.push_back(size);
          }
        }
      };
      // Lists without a sequential copy cost a random read per neighbour (to[e] / from[e]).
      // They are read ahead of the scan in one tight loop, where the reads overlap, instead of
      // one after another inside it. Their edge ids are staged in frontier order, an in-edge
      // stored as ~e.
      s.pending_edge.size = 0;
      s.pending_edge.room(bound);
      int64_t* pe = s.pending_edge.data();
      size_t np = 0;
      for (int64_t f = frontier_begin; f < frontier_end; ++f) {
        const int64_t u = A.nodes[base + f];
        if (hub_lists_.find(u)) continue;
        if (use_out)
          for (igraph_integer_t k = os[u]; k < os[u + 1]; ++k) pe[np++] = oi[k];
        if (use_in)
          for (igraph_integer_t k = is[u]; k < is[u + 1]; ++k) pe[np++] = ~ii[k];
      }
      s.pending_node.size = 0;
      s.pending_node.room(np);
      int64_t* pn = s.pending_node.data();
      for (size_t j = 0; j < np; ++j) {
        if (j + kReadAhead < np) {
          const int64_t x = pe[j + kReadAhead];
          __builtin_prefetch(x >= 0 ? to + x : from + ~x);
        }
        pn[j] = pe[j] >= 0 ? to[pe[j]] : from[~pe[j]];
      }

      size_t cursor = 0;  // into the staged lists
      for (int64_t f = frontier_begin; f < frontier_end; ++f) {
        const int64_t u = A.nodes[base + f];
        const int32_t fi = static_cast<int32_t>(f);
        const igraph_integer_t ob = os[u], out_len = os[u + 1] - ob, ib = is[u], in_len = is[u + 1] - ib;
        const int32_t* copy = hub_lists_.find(u);
        const size_t in_at = cursor + (use_out ? out_len : 0);  // staged in-list start
        auto out_edge = [&](igraph_integer_t k) -> int64_t { return oi[ob + k]; };
        auto in_edge = [&](igraph_integer_t k) -> int64_t { return ii[ib + k]; };
        const int64_t* staged_out = pn + cursor;
        const int64_t* staged_in = pn + in_at;
        auto copy_out = [&](igraph_integer_t k) -> int64_t { return copy[k]; };
        auto copy_in = [&](igraph_integer_t k) -> int64_t { return copy[out_len + k]; };
        auto read_out = [&](igraph_integer_t k) { return staged_out[k]; };
        auto read_in = [&](igraph_integer_t k) { return staged_in[k]; };
        if (filtered || merge) {
          if (copy) {
            if (use_out) scan_filtered(out_len, copy_out, out_edge, fi);
            if (use_in) scan_filtered(in_len, copy_in, in_edge, fi);
          } else {
            if (use_out) scan_filtered(out_len, read_out, out_edge, fi);
            if (use_in) scan_filtered(in_len, read_in, in_edge, fi);
          }
        } else if (copy) {
          if (use_out) scan_fast(out_len, copy_out, out_edge, fi);
          if (use_in) scan_fast(in_len, copy_in, in_edge, fi);
        } else {
          if (use_out) scan_fast(out_len, read_out, out_edge, fi);
          if (use_in) scan_fast(in_len, read_in, in_edge, fi);
        }
        if (!copy) cursor = in_at + (use_in ? in_len : 0);
      }
      s.cand_node.size = s.cand_edge.size = s.cand_from.size = nc;
      s.marked.room(nc);
      std::copy(cn, cn + nc, s.marked.data() + s.marked.size);
      s.marked.size += nc;

      // ---- Scores; a unit (alias merging) is judged by its best member.
      s.cand_score.room(nc);
      float* cs = s.cand_score.data();
      int64_t passing = static_cast<int64_t>(nc);
      if (have_scores) {
        const float* row = dense_row ? dense_row : sparse_row;
        for (size_t i = 0; i < nc; ++i) cs[i] = row[cn[i]];
        bool any_nan = false;
        passing = 0;
        for (size_t i = 0; i < nc; ++i) {
          any_nan |= cs[i] != cs[i];
          passing += cs[i] > opt.threshold;
        }
        if (any_nan) {
          for (size_t i = 0; i < nc && nan_node < 0; ++i) score_of(cn[i]);
          break;
        }
      } else {
        std::fill(cs, cs + nc, kNoScore);
      }
      const float* judged = cs;
      if (merge) {
        s.unit_score.assign(cs, cs + nc);
        for (size_t i = 0; i < nc; ++i)
          for (int64_t k = s.unit_first[i], e = k + s.unit_size[i] - 1; k < e; ++k)
            s.unit_score[i] = std::fmax(s.unit_score[i], score_of(s.unit_members[k]));
        if (nan_node >= 0) break;
        judged = s.unit_score.data();
        if (have_scores) {
          passing = 0;
          for (size_t i = 0; i < nc; ++i) passing += judged[i] > opt.threshold;
        }
      }

      // ---- Keep and admit, in discovery order. The top-up draws only from scored candidates
      // (score > -inf: an unlisted sparse node never rides in on min_keep); they are counted
      // only when the top-up is needed at all, so the common case pays nothing for it.
      const int64_t n_cand = static_cast<int64_t>(nc);
      int64_t top_up = std::min(opt.min_keep, n_cand) - passing;
      if (top_up > 0 && have_scores) {
        int64_t scored = 0;
        for (size_t i = 0; i < nc; ++i) scored += judged[i] > kNegInf;
        top_up = std::min(opt.min_keep, scored) - passing;
      }
      const int64_t room = opt.budget >= 0 ? opt.budget - (static_cast<int64_t>(A.size) - base)
                                           : std::numeric_limits<int64_t>::max();
      const int64_t next_begin = static_cast<int64_t>(A.size) - base;
      bool full = false;
      if (!merge && top_up <= 0 && passing <= room) {
        // The common case: exactly those that pass. Their indices are gathered first without
        // a branch (a third pass at random, which a branch would mispredict), then written.
        size_t n_keep = nc;
        const int32_t* kept = nullptr;
        if (have_scores) {
          s.kept.room(nc);
          int32_t* k = s.kept.data();
          n_keep = 0;
          for (size_t i = 0; i < nc; ++i) k[n_keep] = static_cast<int32_t>(i), n_keep += cs[i] > opt.threshold;
          kept = k;
        }
        A.room(n_keep);
        uint64_t* reached_words = s.reached.words.data();
        const size_t w = A.size;
        for (size_t j = 0; j < n_keep; ++j) {
          const size_t i = kept ? static_cast<size_t>(kept[j]) : j;
          const int64_t v = cn[i], f = base + cf[i];
          A.nodes[w + j] = v, A.hop[w + j] = hop, A.seed[w + j] = A.seed[f], A.parent[w + j] = A.nodes[f];
          A.parent_edge[w + j] = ce[i], A.score[w + j] = cs[i];
          reached_words[v >> 6] |= uint64_t{1} << (v & 63);
        }
        A.size = w + n_keep;
      } else {
        // Keep those with score > threshold, topped up to min_keep with the best of the rest
        // that have a score > -inf (score desc, node asc; there are at least top_up of them).
        // If the budget cannot hold every kept unit, the best are taken in rank order up to the
        // first that does not fit, and the search stops.
        std::vector<uint8_t>& keep = s.keep;
        std::vector<RankKey>& keys = s.keys;
        keep.assign(nc, have_scores ? 0 : 1);
        auto better = [](const RankKey& a, const RankKey& b) {
          return a.score != b.score ? a.score > b.score : a.node < b.node;
        };
        if (have_scores) {
          for (size_t i = 0; i < nc; ++i) keep[i] = judged[i] > opt.threshold;
          if (top_up > 0) {
            keys.clear();
            for (size_t i = 0; i < nc; ++i)
              if (!keep[i] && judged[i] > kNegInf) keys.push_back(RankKey{judged[i], cn[i], static_cast<int64_t>(i)});
            std::nth_element(keys.begin(), keys.begin() + top_up - 1, keys.end(), better);
            for (int64_t i = 0; i < top_up; ++i) keep[keys[i].index] = 1;
          }
        }
        if (opt.budget >= 0) {
          int64_t kept_size = 0;
          for (size_t i = 0; i < nc; ++i) kept_size += keep[i] ? (merge ? s.unit_size[i] : 1) : 0;
          if (kept_size > room) {
            full = true;
            keys.clear();
            for (size_t i = 0; i < nc; ++i)
              if (keep[i]) keys.push_back(RankKey{judged[i], cn[i], static_cast<int64_t>(i)}), keep[i] = 0;
            if (have_scores) std::sort(keys.begin(), keys.end(), better);  // else: discovery order
            int64_t left = room;
            for (const RankKey& k : keys) {
              const int64_t size = merge ? s.unit_size[k.index] : 1;
              if (size > left) break;
              left -= size;
              keep[k.index] = 1;
            }
          }
        }
        for (size_t i = 0; i < nc; ++i)
          if (keep[i]) {
            const int64_t f = base + cf[i];
            admit_unit(cn[i], hop, A.seed[f], A.nodes[f], ce[i], cs[i]);
          }
      }
      frontier_begin = next_begin;
      frontier_end = static_cast<int64_t>(A.size) - base;
      if (full) break;
    }
    if (nan_node >= 0) {
      A.size = static_cast<size_t>(base);
      s.reset();
      throw std::invalid_argument("scores: NaN for node " + std::to_string(nan_node) + " in query " + std::to_string(q));
    }

    // ---- Induced subgraph: every allowed-kind edge whose two ends were reached, found from its
    // source's out-list (each edge once), then sorted. Copied lists are tested in place (or,
    // when much longer than the result, each reached node is looked up in them); the targets
    // of the other lists are read in one overlapping pass first, as in the scan.
    const int64_t edge_begin = static_cast<int64_t>(A.edges.size);
    if (opt.with_edges) {
      const int64_t end = static_cast<int64_t>(A.size), r_size = end - base;
      const uint64_t* reached_words = s.reached.words.data();
      auto is_reached = [&](int64_t v) { return (reached_words[v >> 6] >> (v & 63)) & 1u; };
      s.pending_edge.size = 0;
      bool have_sorted = false;
      for (int64_t i = base; i < end; ++i) {
        const int64_t u = A.nodes[i];
        const igraph_integer_t lo = os[u], deg = os[u + 1] - lo;
        const int32_t* copy = hub_lists_.find(u);
        if (!copy) {
          s.pending_edge.room(static_cast<size_t>(deg));
          std::copy(oi + lo, oi + lo + deg, s.pending_edge.data() + s.pending_edge.size);
          s.pending_edge.size += static_cast<size_t>(deg);
          continue;
        }
        A.edges.room(static_cast<size_t>(deg));
        int64_t* out = A.edges.data();
        size_t ne = A.edges.size;
        if (static_cast<double>(deg) > 16.0 * static_cast<double>(r_size) * std::log2(static_cast<double>(deg) + 1.0)) {
          std::vector<int64_t>& sorted = s.reached_sorted;
          if (!have_sorted) {
            sorted.assign(A.nodes.data() + base, A.nodes.data() + end);
            std::sort(sorted.begin(), sorted.end());
            have_sorted = true;
          }
          const int32_t* it = copy;
          const int32_t* stop = copy + deg;
          for (int64_t v : sorted) {
            it = std::lower_bound(it, stop, static_cast<int32_t>(v));
            for (; it < stop && *it == v; ++it) {
              const int64_t e = oi[lo + (it - copy)];
              out[ne] = e, ne += edge_ok(e);
            }
          }
        } else {
          for (igraph_integer_t j = 0; j < deg; ++j) {
            const int64_t e = oi[lo + j];
            out[ne] = e, ne += is_reached(copy[j]) && edge_ok(e);
          }
        }
        A.edges.size = ne;
      }
      const size_t np = s.pending_edge.size;
      const int64_t* pe = s.pending_edge.data();
      s.pending_node.size = 0;
      s.pending_node.room(np);
      int64_t* pn = s.pending_node.data();
      for (size_t j = 0; j < np; ++j) {
        if (j + kReadAhead < np) __builtin_prefetch(to + pe[j + kReadAhead]);
        pn[j] = to[pe[j]];
      }
      A.edges.room(np);
      int64_t* out = A.edges.data();
      size_t ne = A.edges.size;
      for (size_t j = 0; j < np; ++j) out[ne] = pe[j], ne += is_reached(pn[j]) && edge_ok(pe[j]);
      A.edges.size = ne;
      sort_ids(A.edges.data() + edge_begin, A.edges.size - static_cast<size_t>(edge_begin), m_edges, s.sort_buffer);
    }
    spans[q] = QuerySpan{worker, base, static_cast<int64_t>(A.size), edge_begin, static_cast<int64_t>(A.edges.size)};
    s.reset();
  });

  Expansion out;
  out.node_offsets.assign(nq + 1, 0), out.edge_offsets.assign(nq + 1, 0);
  for (int64_t q = 0; q < nq; ++q) {
    out.node_offsets[q + 1] = out.node_offsets[q] + (spans[q].node_end - spans[q].node_begin);
    out.edge_offsets[q + 1] = out.edge_offsets[q] + (spans[q].edge_end - spans[q].edge_begin);
  }
  const auto total = static_cast<size_t>(out.node_offsets[nq]);
  out.nodes.resize(total), out.seed.resize(total), out.parent.resize(total);
  out.parent_edge.resize(total), out.hop.resize(total), out.score.resize(total);
  out.edges.resize(static_cast<size_t>(out.edge_offsets[nq]));
  parallel_workers(nq, workers, [&](int64_t q, int) {
    const QuerySpan& sp = spans[q];
    const Arena& A = scratch[sp.worker]->arena;
    const int64_t at_node = out.node_offsets[q], at_edge = out.edge_offsets[q];
    copy_range(out.nodes, A.nodes, sp.node_begin, sp.node_end, at_node);
    copy_range(out.seed, A.seed, sp.node_begin, sp.node_end, at_node);
    copy_range(out.parent, A.parent, sp.node_begin, sp.node_end, at_node);
    copy_range(out.parent_edge, A.parent_edge, sp.node_begin, sp.node_end, at_node);
    copy_range(out.hop, A.hop, sp.node_begin, sp.node_end, at_node);
    copy_range(out.score, A.score, sp.node_begin, sp.node_end, at_node);
    copy_range(out.edges, A.edges, sp.edge_begin, sp.edge_end, at_edge);
  });
  return out;
}

}  // namespace colgraph
