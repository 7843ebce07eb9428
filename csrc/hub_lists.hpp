// Sequential copies of the longest adjacency lists of an igraph graph.
//
// igraph lists a node's out-edges as edge ids (oi) and keeps the endpoint in a separate array
// (to[e]), so reading a neighbour costs a random load per edge. On a power-law graph most of a
// BFS's reads fall in a few long lists (the hubs), so copying just those lists as int32 ids,
// laid out in igraph's order, makes nearly every read sequential while costing a bounded
// fraction of memory: copies and their index take at most 2 bytes per edge by default.
#pragma once

#include <igraph.h>

#include <cstdint>
#include <vector>

namespace colgraph {

class HubLists {
 public:
  // Lists are copied longest first while the copies and their index stay within
  // bytes_per_edge * m bytes (kDefaultBytesPerEdge unless the owner sets another budget; every
  // list takes a little over 8, each edge being in two lists); lists shorter than kMinLength are never copied (their
  // reads are few and the copy saves little).
  static constexpr double kDefaultBytesPerEdge = 2.0;
  static constexpr int64_t kMinLength = 8;

  // Rebuilds from the graph's current index vectors.
  void build(const igraph_t& graph, double bytes_per_edge);
  // After edges were appended among nodes that are all >= the node count of the last build or
  // extend (no older node's lists changed): copies the new nodes' lists that reach the current
  // shortest copied length, in O(new nodes + their edges); rebuilds when that would pass the
  // budget or the precondition does not hold. Lookups give the same lists either way.
  void extend(const igraph_t& graph, double bytes_per_edge, int64_t lowest_new);

  // u's out-neighbours in oi order followed by its in-neighbours in ii order, or nullptr when
  // u's lists are not copied.
  const int32_t* find(int64_t u) const {
    const uint64_t word = is_hub_[u >> 6], bit = uint64_t{1} << (u & 63);
    if (!(word & bit)) return nullptr;
    return ids_.data() + start_[rank_base_[u >> 6] + __builtin_popcountll(word & (bit - 1))];
  }

  int64_t hubs() const { return static_cast<int64_t>(start_.size()) - 1; }
  int64_t copied_ids() const { return static_cast<int64_t>(ids_.size()); }
  int64_t memory_bytes() const {
    return static_cast<int64_t>(8 * is_hub_.capacity() + 4 * rank_base_.capacity() + 8 * start_.capacity() +
                                4 * ids_.capacity());
  }

 private:
  std::vector<uint64_t> is_hub_;    // [ceil(n / 64)] one bit per node
  std::vector<int32_t> rank_base_;  // [ceil(n / 64)] hubs with a smaller id than the word's first node
  std::vector<int64_t> start_;      // [hubs + 1] where each hub's copy begins in ids_
  std::vector<int32_t> ids_;
  int64_t covered_ = 0;     // nodes the tables cover
  int64_t min_length_ = 0;  // shortest copied length chosen by the last build
};

}  // namespace colgraph
