#include "hub_lists.hpp"

#include <algorithm>

#include "huge_pages.hpp"

namespace colgraph {

void HubLists::build(const igraph_t& graph, double bytes_per_edge) {
  const int64_t n = igraph_vcount(&graph), m = igraph_ecount(&graph);
  const igraph_integer_t *from = VECTOR(graph.from), *to = VECTOR(graph.to), *oi = VECTOR(graph.oi),
                         *ii = VECTOR(graph.ii), *os = VECTOR(graph.os), *is = VECTOR(graph.is);
  auto degree = [&](int64_t u) { return (os[u + 1] - os[u]) + (is[u + 1] - is[u]); };

  // The shortest length that may be copied: lengths are counted, then taken longest first until
  // the next length would overflow the budget (all lists of one length are copied or none, so
  // the choice does not depend on node ids).
  const int64_t words = (n + 63) / 64;
  const auto budget = static_cast<int64_t>(bytes_per_edge * static_cast<double>(m)) - 12 * words - 8;  // minus bits, ranks, start_[0]
  std::vector<int64_t> lists_of_length;
  for (int64_t u = 0; u < n; ++u) {
    const int64_t d = degree(u);
    if (d >= kMinLength) {
      if (static_cast<int64_t>(lists_of_length.size()) <= d) lists_of_length.resize(d + 1, 0);
      ++lists_of_length[d];
    }
  }
  // (no list reaches kMinLength: nothing is copied)
  int64_t min_length = std::max<int64_t>(static_cast<int64_t>(lists_of_length.size()), kMinLength), total = 0, bytes = 0;
  for (int64_t d = min_length - 1; d >= kMinLength; --d) {
    const int64_t more = (4 * d + 8) * lists_of_length[d];  // ids and a start_ entry per list
    if (bytes + more > budget) break;
    bytes += more, total += d * lists_of_length[d];
    min_length = d;
  }

  is_hub_.assign(words, 0);
  rank_base_.assign(words, 0);
  start_.assign(1, 0);
  ids_.clear();
  ids_.reserve(total);
  advise_huge_pages(ids_.data(), sizeof(int32_t) * static_cast<size_t>(total), false);
  int64_t hubs = 0;
  for (int64_t u = 0; u < n; ++u) {
    if ((u & 63) == 0) rank_base_[u >> 6] = static_cast<int32_t>(hubs);
    if (degree(u) < min_length) continue;
    is_hub_[u >> 6] |= uint64_t{1} << (u & 63);
    ++hubs;
    for (igraph_integer_t k = os[u]; k < os[u + 1]; ++k) ids_.push_back(static_cast<int32_t>(to[oi[k]]));
    for (igraph_integer_t k = is[u]; k < is[u + 1]; ++k) ids_.push_back(static_cast<int32_t>(from[ii[k]]));
    start_.push_back(static_cast<int64_t>(ids_.size()));
  }
  ids_.shrink_to_fit();
  start_.shrink_to_fit();
  covered_ = n, min_length_ = min_length;
}

void HubLists::extend(const igraph_t& graph, double bytes_per_edge, int64_t lowest_new) {
  const int64_t n = igraph_vcount(&graph), m = igraph_ecount(&graph);
  if (lowest_new < covered_) return build(graph, bytes_per_edge);
  const igraph_integer_t *from = VECTOR(graph.from), *to = VECTOR(graph.to), *oi = VECTOR(graph.oi),
                         *ii = VECTOR(graph.ii), *os = VECTOR(graph.os), *is = VECTOR(graph.is);
  const int64_t words = (n + 63) / 64;
  const auto budget = static_cast<int64_t>(bytes_per_edge * static_cast<double>(m)) - 12 * words - 8;
  int64_t more = 0;
  for (int64_t u = covered_; u < n; ++u) {
    const int64_t d = (os[u + 1] - os[u]) + (is[u + 1] - is[u]);
    if (d >= min_length_) more += 4 * d + 8;
  }
  if (more && static_cast<int64_t>(4 * ids_.size() + 8 * (start_.size() - 1)) + more > budget)
    return build(graph, bytes_per_edge);
  int64_t hubs = static_cast<int64_t>(start_.size()) - 1;
  is_hub_.resize(words, 0);
  rank_base_.resize(words, 0);
  for (int64_t u = covered_; u < n; ++u) {
    if ((u & 63) == 0) rank_base_[u >> 6] = static_cast<int32_t>(hubs);
    const int64_t d = (os[u + 1] - os[u]) + (is[u + 1] - is[u]);
    if (d < min_length_) continue;
    is_hub_[u >> 6] |= uint64_t{1} << (u & 63);
    ++hubs;
    for (igraph_integer_t k = os[u]; k < os[u + 1]; ++k) ids_.push_back(static_cast<int32_t>(to[oi[k]]));
    for (igraph_integer_t k = is[u]; k < is[u + 1]; ++k) ids_.push_back(static_cast<int32_t>(from[ii[k]]));
    start_.push_back(static_cast<int64_t>(ids_.size()));
  }
  covered_ = n;
}

}  // namespace colgraph
