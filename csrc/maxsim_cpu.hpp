// Fused CPU MaxSim over packed multi-vectors.
//
//   score(q, x) = sum_i max_j <q_i, x_j>     (fp32 accumulation for every input dtype)
//
// The similarity matrix never reaches memory: query tokens are packed 16 to a vector register
// (k-major), document tokens are broadcast one coordinate at a time, and the max over document
// tokens is an element-wise vmaxps across accumulators. An empty document scores -inf for a
// non-empty query; an empty query scores 0.
#pragma once

#include <cstdint>
#include <string>

namespace colgraph {

enum class ElemType { F32, BF16, F16 };

struct PackedView {
  const void* values;      // [T, dim] row-major
  const int64_t* offsets;  // [n + 1]
  int64_t n;
  int64_t dim;
};

// out[i * n_docs + j] = score(query i, document j).
void maxsim_cross_cpu(const PackedView& queries, const PackedView& docs, ElemType type, float* out,
                      int num_threads);

// out[c] = score(query q(c), document cand_ids[c]), where q(c) is the query whose CSR range
// cand_offsets[q]..cand_offsets[q+1] holds c. Each listed document is read once for all of
// the queries that list it; on AVX-512 (fp32 after widening, d a multiple of 16) a document may
// instead be transposed once and scored with its rows in the lanes (work by tokens, not by
// 16-token blocks), chosen per document by cost; the scores are the same bits either way.
void maxsim_candidates_cpu(const PackedView& queries, const PackedView& docs, ElemType type,
                           const int64_t* cand_offsets, const int64_t* cand_ids, int64_t n_cand,
                           float* out, int num_threads);

// Which instruction sets the dispatcher found on this processor ("avx512f", "avx512bf16").
std::string cpu_kernel_isa(ElemType type);

}  // namespace colgraph
