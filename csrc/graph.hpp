// Typed multimodal knowledge graph on the igraph C library, with batched, relevance-filtered
// multi-source BFS expansion.
//
// Storage: one directed igraph_t holds the topology (edge e runs from[e] -> to[e]); node
// kind/document/weight and edge kind/weight live beside it in columnar vectors indexed by
// igraph's vertex and edge ids. Expansion (expand.cpp) reads igraph's index vectors (from, to,
// oi, ii, os, is) plus int32 copies of the longest adjacency lists (hub_lists.hpp), all
// read-only while worker threads run, and calls no igraph function there (Debian's igraph is
// built without thread-local error state).
#pragma once

#include <igraph.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "hub_lists.hpp"
#include "huge_pages.hpp"

namespace colgraph {

// "name[i]": how an error message names element i of an input array.
inline std::string at(const char* what, int64_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

struct CsrView {  // offsets == nullptr means "absent"
  const int64_t* offsets = nullptr;
  const int64_t* values = nullptr;
};

struct ScoresView {  // dense [nq, n] row-major, or sparse CSR per query, or neither
  const float* dense = nullptr;
  const int64_t* sparse_offsets = nullptr;
  const int64_t* sparse_nodes = nullptr;
  const float* sparse_values = nullptr;
  bool present() const { return dense != nullptr || sparse_offsets != nullptr; }
};

enum class Direction : int { Both = 0, Out = 1, In = 2 };

struct ExpandOptions {
  int64_t hops = 1;
  float threshold = 0.0f;        // a neighbour passes when score > threshold
  int64_t min_keep = 0;          // ... and at least this many best candidates are kept per hop
  int64_t budget = -1;           // most nodes reached per query (seeds always kept); -1 = none
  uint64_t node_kind_mask = ~0ull;
  uint64_t edge_kind_mask = ~0ull;
  Direction direction = Direction::Both;
  bool merge_aliases = false;
  bool with_edges = true;        // also list the induced subgraph's edges
};

// Per query, concatenated in query order (CSR by node_offsets / edge_offsets).
// Allocates without value-initialising (a result column is written in full right after it
// is sized, and zeroing tens of megabytes first would cost as much as the copy itself) and
// asks for huge pages, so filling it takes few page faults.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind { using other = UninitAllocator<U>; };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) {}
  template <class U>
  void construct(U* p) noexcept { ::new (static_cast<void*>(p)) U; }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) { ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...); }
  T* allocate(size_t n) {
    T* p = std::allocator<T>::allocate(n);
    advise_huge_pages(p, n * sizeof(T), false);  // fresh: fewer, larger page faults when filled
    return p;
  }
};
template <class T>
using Column = std::vector<T, UninitAllocator<T>>;

struct Expansion {
  std::vector<int64_t> node_offsets, edge_offsets;
  Column<int64_t> nodes, seed, parent, parent_edge, edges;
  Column<int32_t> hop;
  Column<float> score;
};

struct ExpandScratch;  // per-thread working memory of an expansion (expand.cpp)

// Keeps expansion scratch between calls: sizing it to a million-node graph costs more than
// a batch of queries, so workers borrow one and hand it back.
class ScratchPool {
 public:
  ScratchPool();
  ~ScratchPool();
  std::unique_ptr<ExpandScratch> acquire();
  void release(std::unique_ptr<ExpandScratch> s);

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<ExpandScratch>> free_;
};

class KnowledgeGraph {
 public:
  KnowledgeGraph();
  ~KnowledgeGraph();
  KnowledgeGraph(const KnowledgeGraph&) = delete;
  KnowledgeGraph& operator=(const KnowledgeGraph&) = delete;

  // Both calls validate everything first and leave the graph unchanged when they throw.
  void add_nodes(int64_t count, const uint8_t* kind, const int64_t* doc, const float* weight);
  void add_edges(int64_t count, const int64_t* src, const int64_t* dst, const uint8_t* kind,
                 const float* weight);
  // group_of[v] >= 0 puts v in that alias group; -1 leaves it alone. Replaces the table.
  void set_aliases(const int64_t* group_of);

  int64_t n_nodes() const;
  int64_t n_edges() const;
  void edge_list(int64_t* src, int64_t* dst) const;
  // Copies of the attribute columns, widened to the API's types.
  std::vector<uint8_t> node_kind() const;
  std::vector<int64_t> node_doc() const;
  std::vector<float> node_weight() const;
  std::vector<uint8_t> edge_kind() const;
  std::vector<float> edge_weight() const;
  std::vector<int64_t> alias_of() const;
  // igraph's own igraph_neighbors (mode 0 all, 1 out, 2 in): a check that the structure is sound.
  std::vector<int64_t> igraph_neighbors_of(int64_t v, int mode) const;
  // Bytes held by the graph: igraph's vectors plus the attribute columns.
  int64_t memory_bytes() const;
  const HubLists& hub_lists() const { return hub_lists_; }
  // Memory for sequential copies of the longest adjacency lists, in bytes per edge (>= 0);
  // rebuilds the copies.
  void set_copy_budget(double bytes_per_edge);
  double copy_budget() const { return copy_budget_; }

  Expansion expand(int64_t n_queries, CsrView seeds, ScoresView scores, CsrView docs,
                   const ExpandOptions& options, int num_threads) const;

 private:
  void bulk_load_edges(int64_t m, const int64_t* src, const int64_t* dst);
  void append_edges_above(int64_t count, const int64_t* src, const int64_t* dst, int64_t lowest);
  void advise_storage();  // huge pages for the arrays expansion reads at random

  igraph_t graph_;
  // Columns are as narrow as their ranges allow (memory per edge is a target). A weight column
  // stays empty while every weight is 1, the common case for extracted graphs.
  std::vector<uint8_t> node_kind_, edge_kind_;
  std::vector<int32_t> node_doc_;
  std::vector<float> node_weight_, edge_weight_;
  std::vector<int32_t> alias_of_;                       // [n] group or -1
  HubLists hub_lists_;  // rebuilt after every change of the edges
  double copy_budget_ = HubLists::kDefaultBytesPerEdge;
  std::vector<int64_t> group_offsets_, group_members_;  // members of each group, ascending
  int64_t max_doc_ = -1;
  int64_t max_endpoint_ = -1;  // largest node id any stored edge touches (-1: no edges)
  mutable std::shared_mutex mutex_;  // expansions share; mutations are exclusive
  mutable ScratchPool scratch_pool_;
};

}  // namespace colgraph
