#include "maxsim_cpu.hpp"

#include "parallel.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <utility>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

namespace colgraph {
namespace {

constexpr int kLanes = 16;           // fp32 lanes in one 512-bit register
constexpr int kRowsWide = 12;        // document tokens per micro-tile with 32 query tokens
constexpr int kRowsNarrow = 24;      // ... with 16 query tokens
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  // IEEE half -> single, exact for all inputs (subnormals included).
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool has_avx512f() { return __builtin_cpu_supports("avx512f"); }
bool has_avx512bf16() {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------
// Query packing. A query of L tokens becomes ceil(L/16) blocks; block b holds tokens
// 16b..16b+15 k-major, so one aligned load gives one coordinate of 16 tokens. Lanes past L
// are zero and are excluded when lanes are summed.
//   fp32 layout: [block][k][16]          float
//   bf16 layout: [block][k/2][16][2]     uint16 (coordinate pairs, as vdpbf16ps consumes)
// ---------------------------------------------------------------------------------------
struct PackedQueries {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<int64_t> block_start;  // first block of query i, [n + 1]
  std::vector<int64_t> length;       // tokens of query i
  int64_t k_steps = 0;               // d for fp32, d/2 for bf16
};

float load_as_f32(const void* base, int64_t index, ElemType type) {
  switch (type) {
    case ElemType::F32: return static_cast<const float*>(base)[index];
    case ElemType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
    default: return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
  }
}

PackedQueries pack_queries(const PackedView& q, ElemType type, bool bf16_pairs) {
  PackedQueries p;
  const int64_t d = q.dim;
  p.block_start.resize(q.n + 1, 0);
  p.length.resize(q.n);
  for (int64_t i = 0; i < q.n; ++i) {
    p.length[i] = q.offsets[i + 1] - q.offsets[i];
    p.block_start[i + 1] = p.block_start[i] + (p.length[i] + kLanes - 1) / kLanes;
  }
  const int64_t blocks = p.block_start[q.n];
  if (bf16_pairs) {
    p.k_steps = d / 2;
    p.bf16.assign(static_cast<size_t>(blocks * p.k_steps * kLanes * 2), 0);
    const auto* src = static_cast<const uint16_t*>(q.values);
    for (int64_t i = 0; i < q.n; ++i)
      for (int64_t t = 0; t < p.length[i]; ++t) {
        const int64_t row = q.offsets[i] + t, blk = p.block_start[i] + t / kLanes, lane = t % kLanes;
        for (int64_t k = 0; k < d; ++k)
          p.bf16[((blk * p.k_steps + k / 2) * kLanes + lane) * 2 + (k & 1)] = src[row * d + k];
      }
  } else {
    p.k_steps = d;
    p.f32.assign(static_cast<size_t>(blocks * d * kLanes), 0.0f);
    for (int64_t i = 0; i < q.n; ++i)
      for (int64_t t = 0; t < p.length[i]; ++t) {
        const int64_t row = q.offsets[i] + t, blk = p.block_start[i] + t / kLanes, lane = t % kLanes;
        for (int64_t k = 0; k < d; ++k)
          p.f32[(blk * d + k) * kLanes + lane] = load_as_f32(q.values, row * d + k, type);
      }
  }
  return p;
}

// A document as the micro-kernels read it: `rows` tokens of `stride` elements. For the
// tail tile the last row is repeated, which leaves every max unchanged.
struct DocRows {
  const void* base;
  int64_t rows;
  int64_t stride;  // elements of the stored type per row
};

// ---------------------------------------------------------------------------------------
// AVX-512 micro-kernels. `MV` query blocks (16 tokens each) against `NR` document tokens.
// ---------------------------------------------------------------------------------------
template <int MV, int NR>
__attribute__((target("avx512f"))) inline void tile_f32(const float* qt, int64_t q_block_stride,
                                                        const float* doc, int64_t stride,
                                                        int64_t row0, int64_t rows, int64_t d,
                                                        __m512* running_max) {
  const float* r[NR];
  for (int i = 0; i < NR; ++i) r[i] = doc + std::min<int64_t>(row0 + i, rows - 1) * stride;
  __m512 acc[MV][NR];
  for (int m = 0; m < MV; ++m)
    for (int i = 0; i < NR; ++i) acc[m][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < d; ++k) {
    __m512 qv[MV];
    for (int m = 0; m < MV; ++m) qv[m] = _mm512_loadu_ps(qt + m * q_block_stride + k * kLanes);
    for (int i = 0; i < NR; ++i) {
      const __m512 b = _mm512_set1_ps(r[i][k]);
      for (int m = 0; m < MV; ++m) acc[m][i] = _mm512_fmadd_ps(qv[m], b, acc[m][i]);
    }
  }
  for (int m = 0; m < MV; ++m)
    for (int i = 0; i < NR; ++i) running_max[m] = _mm512_max_ps(running_max[m], acc[m][i]);
}

// A query of at most 8 tokens fills half of a 16-lane block: its lanes 0-7 in 8-lane registers
// instead. On AVX-512 machines two 256-bit FMAs issue a cycle where one 512-bit FMA does on some
// cores (Zen 4); on AVX2 machines the second 8-lane half is skipped. Each lane computes the same
// FMA chain over k as tile_f32 and block_maxima_avx2, and max is exact, so the scores are
// bit-identical to the 16-lane kernels'.
template <int NR>
__attribute__((target("avx2,fma"))) inline void tile_f32_narrow(const float* qt, const float* doc,
                                                                        int64_t stride, int64_t row0, int64_t rows,
                                                                        int64_t d, __m256& running_max) {
  const float* r[NR];
  for (int i = 0; i < NR; ++i) r[i] = doc + std::min<int64_t>(row0 + i, rows - 1) * stride;
  __m256 acc[NR];
  for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < d; ++k) {
    const __m256 qv = _mm256_loadu_ps(qt + k * kLanes);  // lanes 0-7 of the block's coordinate k
    for (int i = 0; i < NR; ++i) acc[i] = _mm256_fmadd_ps(qv, _mm256_broadcast_ss(r[i] + k), acc[i]);
  }
  for (int i = 0; i < NR; ++i) running_max = _mm256_max_ps(running_max, acc[i]);
}

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
template <int MV, int NR>
__attribute__((target("avx512f,avx512bf16"))) inline void tile_bf16(
    const uint16_t* qt, int64_t q_block_stride, const uint16_t* doc, int64_t stride, int64_t row0,
    int64_t rows, int64_t pairs, __m512* running_max) {
  const uint32_t* r[NR];
  for (int i = 0; i < NR; ++i)
    r[i] = reinterpret_cast<const uint32_t*>(doc + std::min<int64_t>(row0 + i, rows - 1) * stride);
  __m512 acc[MV][NR];
  for (int m = 0; m < MV; ++m)
    for (int i = 0; i < NR; ++i) acc[m][i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh qv[MV];
    for (int m = 0; m < MV; ++m)
      qv[m] = (__m512bh)_mm512_loadu_si512(qt + m * q_block_stride + p * kLanes * 2);
    for (int i = 0; i < NR; ++i) {
      uint32_t word;
      std::memcpy(&word, r[i] + p, 4);
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
      for (int m = 0; m < MV; ++m) acc[m][i] = _mm512_dpbf16_ps(acc[m][i], qv[m], b);
    }
  }
  for (int m = 0; m < MV; ++m)
    for (int i = 0; i < NR; ++i) running_max[m] = _mm512_max_ps(running_max[m], acc[m][i]);
}
#endif

// Sums the first `valid` lanes of the per-token maxima of one query.
float sum_lanes(const float* maxima, int64_t valid) {
  double s = 0.0;  // fixed order; wider than fp32 so the lane sum adds no visible error
  for (int64_t t = 0; t < valid; ++t) s += maxima[t];
  return static_cast<float>(s);
}

// Running maxima over one document of query blocks `blk` and, when `two`, `blk + 1`:
// run[m] lane l = max_j <token 16 (blk + m) + l, x_j>.
template <bool BF16>
__attribute__((target("avx512f"))) inline void block_pair_maxima(const PackedQueries& pq, int64_t blk, bool two,
                                                                 const DocRows& doc, int64_t d, __m512* run) {
  const int64_t block_elems = pq.k_steps * kLanes * (BF16 ? 2 : 1);
  run[0] = run[1] = _mm512_set1_ps(kNegInf);
  if constexpr (BF16) {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    const uint16_t* qt = pq.bf16.data() + blk * block_elems;
    const auto* base = static_cast<const uint16_t*>(doc.base);
    if (two)
      for (int64_t j = 0; j < doc.rows; j += kRowsWide)
        tile_bf16<2, kRowsWide>(qt, block_elems, base, doc.stride, j, doc.rows, pq.k_steps, run);
    else
      for (int64_t j = 0; j < doc.rows; j += kRowsNarrow)
        tile_bf16<1, kRowsNarrow>(qt, block_elems, base, doc.stride, j, doc.rows, pq.k_steps, run);
#endif
  } else {
    const float* qt = pq.f32.data() + blk * block_elems;
    const auto* base = static_cast<const float*>(doc.base);
    if (two)
      for (int64_t j = 0; j < doc.rows; j += kRowsWide)
        tile_f32<2, kRowsWide>(qt, block_elems, base, doc.stride, j, doc.rows, d, run);
    else
      for (int64_t j = 0; j < doc.rows; j += kRowsNarrow)
        tile_f32<1, kRowsNarrow>(qt, block_elems, base, doc.stride, j, doc.rows, d, run);
  }
}

// Per-token maxima of one query over one document, AVX-512, fp32 or bf16 pairs.
template <bool BF16>
__attribute__((target("avx512f"))) float score_avx512(const PackedQueries& pq, int64_t qi,
                                                      const DocRows& doc, int64_t d) {
  const int64_t len = pq.length[qi];
  if (len == 0) return 0.0f;
  if (doc.rows == 0) return kNegInf;
  alignas(64) float maxima[2 * kLanes];
  if constexpr (!BF16) {
    if (len <= kLanes / 2) {  // one half-filled block: the 8-lane kernel (same bits)
      const float* qt = pq.f32.data() + pq.block_start[qi] * d * kLanes;
      const auto* base = static_cast<const float*>(doc.base);
      __m256 run = _mm256_set1_ps(kNegInf);
      constexpr int kRows8 = 12;  // 12 accumulators + the query vector + broadcasts fit 16 ymm registers
      for (int64_t j = 0; j < doc.rows; j += kRows8)
        tile_f32_narrow<kRows8>(qt, base, doc.stride, j, doc.rows, d, run);
      _mm256_store_ps(maxima, run);
      return static_cast<float>(static_cast<double>(sum_lanes(maxima, len)));
    }
  }
  double total = 0.0;
  for (int64_t blk = pq.block_start[qi]; blk < pq.block_start[qi + 1]; blk += 2) {
    const int64_t first_tok = (blk - pq.block_start[qi]) * kLanes;
    const bool two = blk + 1 < pq.block_start[qi + 1];
    __m512 run[2];
    block_pair_maxima<BF16>(pq, blk, two, doc, d, run);
    _mm512_store_ps(maxima, run[0]);
    _mm512_store_ps(maxima + kLanes, run[1]);
    total += sum_lanes(maxima, std::min<int64_t>(len - first_tok, two ? 2 * kLanes : kLanes));
  }
  return static_cast<float>(total);
}

// Portable path (no AVX-512): same packing, plain loops the compiler vectorises.
float score_portable(const PackedQueries& pq, int64_t qi, const DocRows& doc, int64_t d) {
  const int64_t len = pq.length[qi];
  if (len == 0) return 0.0f;
  if (doc.rows == 0) return kNegInf;
  const auto* base = static_cast<const float*>(doc.base);
  double total = 0.0;
  float maxima[kLanes], acc[kLanes];
  for (int64_t blk = pq.block_start[qi]; blk < pq.block_start[qi + 1]; ++blk) {
    const float* qt = pq.f32.data() + blk * d * kLanes;
    std::fill(maxima, maxima + kLanes, kNegInf);
    for (int64_t j = 0; j < doc.rows; ++j) {
      const float* row = base + j * doc.stride;
      std::fill(acc, acc + kLanes, 0.0f);
      for (int64_t k = 0; k < d; ++k)
        for (int l = 0; l < kLanes; ++l) acc[l] += qt[k * kLanes + l] * row[k];
      for (int l = 0; l < kLanes; ++l) maxima[l] = std::max(maxima[l], acc[l]);
    }
    const int64_t first_tok = (blk - pq.block_start[qi]) * kLanes;
    total += sum_lanes(maxima, std::min<int64_t>(len - first_tok, kLanes));
  }
  return static_cast<float>(total);
}

// AVX2 + FMA path (CPUs without AVX-512, e.g. Zen 2/3 and many Intel client cores): the portable
// loops over the same 16-lane blocks with two 8-lane fused multiply-adds per token and two
// document rows at a time. Per lane the sum over k runs in the same order as the portable loop;
// only the fused rounding differs, so a machine's scores are fixed by the path it takes.
// Lane maxima of one 16-token query block `qt` ([k][16] fp32) over one document, into maxima[16].
__attribute__((target("avx2,fma"))) inline void block_maxima_avx2(const float* qt, const DocRows& doc, int64_t d,
                                                                  float* maxima) {
  const auto* base = static_cast<const float*>(doc.base);
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0;
  int64_t j = 0;
  for (; j + 2 <= doc.rows; j += 2) {
    const float* ra = base + j * doc.stride;
    const float* rb = ra + doc.stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    for (int64_t k = 0; k < d; ++k) {
      const __m256 q0 = _mm256_loadu_ps(qt + k * kLanes), q1 = _mm256_loadu_ps(qt + k * kLanes + 8);
      const __m256 va = _mm256_broadcast_ss(ra + k), vb = _mm256_broadcast_ss(rb + k);
      a0 = _mm256_fmadd_ps(q0, va, a0);
      a1 = _mm256_fmadd_ps(q1, va, a1);
      b0 = _mm256_fmadd_ps(q0, vb, b0);
      b1 = _mm256_fmadd_ps(q1, vb, b1);
    }
    m0 = _mm256_max_ps(m0, _mm256_max_ps(a0, b0));
    m1 = _mm256_max_ps(m1, _mm256_max_ps(a1, b1));
  }
  for (; j < doc.rows; ++j) {
    const float* ra = base + j * doc.stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int64_t k = 0; k < d; ++k) {
      const __m256 va = _mm256_broadcast_ss(ra + k);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + k * kLanes), va, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + k * kLanes + 8), va, a1);
    }
    m0 = _mm256_max_ps(m0, a0);
    m1 = _mm256_max_ps(m1, a1);
  }
  _mm256_storeu_ps(maxima, m0);
  _mm256_storeu_ps(maxima + 8, m1);
}

__attribute__((target("avx2,fma"))) float score_avx2(const PackedQueries& pq, int64_t qi, const DocRows& doc,
                                                     int64_t d) {
  const int64_t len = pq.length[qi];
  if (len == 0) return 0.0f;
  if (doc.rows == 0) return kNegInf;
  double total = 0.0;
  alignas(32) float maxima[kLanes];
  if (len <= kLanes / 2) {  // one half-filled block: only its first 8 lanes (same bits)
    __m256 run = _mm256_set1_ps(kNegInf);
    for (int64_t j = 0; j < doc.rows; j += 12)
      tile_f32_narrow<12>(pq.f32.data() + pq.block_start[qi] * d * kLanes, static_cast<const float*>(doc.base),
                          doc.stride, j, doc.rows, d, run);
    _mm256_store_ps(maxima, run);
    return static_cast<float>(static_cast<double>(sum_lanes(maxima, len)));
  }
  for (int64_t blk = pq.block_start[qi]; blk < pq.block_start[qi + 1]; ++blk) {
    block_maxima_avx2(pq.f32.data() + blk * d * kLanes, doc, d, maxima);
    const int64_t first_tok = (blk - pq.block_start[qi]) * kLanes;
    total += sum_lanes(maxima, std::min<int64_t>(len - first_tok, kLanes));
  }
  return static_cast<float>(total);
}

bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

enum class Path { Avx512F32, Avx512BF16, Avx2F32, Portable };

// Chooses the kernel and whether documents must first be widened to fp32.
struct Plan {
  Path path;
  bool widen_docs;
};

Plan make_plan(ElemType type, int64_t d) {
  if (type == ElemType::BF16 && d % 2 == 0 && has_avx512bf16()) return {Path::Avx512BF16, false};
  if (has_avx512f()) return {Path::Avx512F32, type != ElemType::F32};
  return {has_avx2_fma() ? Path::Avx2F32 : Path::Portable, type != ElemType::F32};
}

// 16-bit rows widened to fp32, 16 elements per instruction: vcvtph2ps is exact for every
// half (subnormals included), and a bf16 is the high half of its fp32, so both give the same
// values as load_as_f32 element by element (scores stay bit-identical), without its per-element
// branches (the scalar loop made an fp16 store 1.6x slower to score than fp32).
__attribute__((target("avx512f"))) void widen_avx512(const uint16_t* src, float* dst, int64_t n, ElemType type) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512 f = type == ElemType::F16
                         ? _mm512_cvtph_ps(h)
                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_storeu_ps(dst + i, f);
  }
  for (; i < n; ++i) dst[i] = load_as_f32(src, i, type);
}

// The same widening on AVX2 machines with F16C (8 elements per instruction): without it the
// AVX2 path spent as long converting a float16 store's rows as scoring them.
__attribute__((target("avx2,f16c"))) void widen_avx2(const uint16_t* src, float* dst, int64_t n, ElemType type) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 f = type == ElemType::F16
                         ? _mm256_cvtph_ps(h)
                         : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    _mm256_storeu_ps(dst + i, f);
  }
  for (; i < n; ++i) dst[i] = load_as_f32(src, i, type);
}

bool has_f16c() { return __builtin_cpu_supports("f16c"); }

// Resolves document j to the rows a kernel reads, widening to fp32 in `scratch` when needed.
DocRows doc_rows(const PackedView& docs, ElemType type, const Plan& plan, int64_t j,
                 std::vector<float>& scratch) {
  const int64_t begin = docs.offsets[j], rows = docs.offsets[j + 1] - begin, d = docs.dim;
  const size_t elem = type == ElemType::F32 ? 4 : 2;
  if (!plan.widen_docs)
    return {static_cast<const char*>(docs.values) + begin * d * elem, rows, d};
  scratch.resize(static_cast<size_t>(std::max<int64_t>(rows, 1) * d));
  if (plan.path == Path::Avx512F32) {
    widen_avx512(static_cast<const uint16_t*>(docs.values) + begin * d, scratch.data(), rows * d, type);
  } else if (plan.path == Path::Avx2F32 && has_f16c()) {
    widen_avx2(static_cast<const uint16_t*>(docs.values) + begin * d, scratch.data(), rows * d, type);
  } else {
    for (int64_t i = 0; i < rows * d; ++i) scratch[i] = load_as_f32(docs.values, begin * d + i, type);
  }
  return {scratch.data(), rows, d};
}

float score_one(const Plan& plan, const PackedQueries& pq, int64_t qi, const DocRows& doc, int64_t d) {
  switch (plan.path) {
    case Path::Avx512BF16: return score_avx512<true>(pq, qi, doc, d);
    case Path::Avx512F32: return score_avx512<false>(pq, qi, doc, d);
    case Path::Avx2F32: return score_avx2(pq, qi, doc, d);
    default: return score_portable(pq, qi, doc, d);
  }
}

// ---------------------------------------------------------------------------------------
// Document-lane kernel for candidate scoring (AVX-512, fp32 after widening). The row tiles above
// hold 16 query tokens in a register's lanes and broadcast document rows: a query of 9-15 tokens
// leaves up to 7 of 16 lanes idle, and the tail tile repeats rows. Here a run's document is
// transposed once ([block][k][16], 16 rows a block, the last row repeated past the end) and every
// token of every query that lists it is broadcast coordinate by coordinate against those lanes,
// so the work is tokens x ceil(rows / 16) x d whatever a query's length. Each lane's dot product
// is the same FMA chain over k = 0..d-1 from zero as in the row tiles (fma(x, q, acc) equals
// fma(q, x, acc) bit for bit), max is exact, and the token maxima are summed in the same chunks
// (score_from_maxima), so the scores are bit-identical to the row tiles' on every input.
// ---------------------------------------------------------------------------------------

// dst[i * 16 + r] = rows[r][k0 + i] for a 16 x 16 tile (unpack, unpack, two lane shuffles).
__attribute__((target("avx512f"))) inline void transpose16(const float* const* rows, int64_t k0, float* dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows[i] + k0);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * 16, r[i]);
}

// fp32 rows [rows, d] (d a multiple of 16) -> out [ceil(rows / 16)][d][16].
__attribute__((target("avx512f"))) void transpose_rows(const DocRows& doc, int64_t d, std::vector<float>& out) {
  const int64_t nb = (doc.rows + kLanes - 1) / kLanes;
  out.resize(static_cast<size_t>(nb * d * kLanes));
  const auto* base = static_cast<const float*>(doc.base);
  for (int64_t b = 0; b < nb; ++b) {
    const float* rows[kLanes];
    for (int r = 0; r < kLanes; ++r) rows[r] = base + std::min<int64_t>(b * kLanes + r, doc.rows - 1) * doc.stride;
    for (int64_t k0 = 0; k0 < d; k0 += kLanes) transpose16(rows, k0, out.data() + (b * d + k0) * kLanes);
  }
}

// maxima[t] = max over the document's rows of <token t, row> for NT tokens whose coordinate k is
// at q[t][k * 16] (the packed queries' k-major layout), two row blocks at a time.
template <int NT>
__attribute__((target("avx512f"))) inline void lane_maxima(const float* const* q, const float* xt, int64_t nb,
                                                           int64_t d, float* maxima) {
  for (int t = 0; t < NT; ++t) maxima[t] = kNegInf;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const float* x0 = xt + b * d * kLanes;
    const float* x1 = x0 + d * kLanes;
    __m512 acc0[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < d; ++k) {
      const __m512 a = _mm512_loadu_ps(x0 + k * kLanes), c = _mm512_loadu_ps(x1 + k * kLanes);
      for (int t = 0; t < NT; ++t) {
        const __m512 qb = _mm512_set1_ps(q[t][k * kLanes]);
        acc0[t] = _mm512_fmadd_ps(a, qb, acc0[t]);
        acc1[t] = _mm512_fmadd_ps(c, qb, acc1[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      maxima[t] = std::max(maxima[t], _mm512_reduce_max_ps(_mm512_max_ps(acc0[t], acc1[t])));
  }
  if (b < nb) {  // an odd last block alone
    const float* x0 = xt + b * d * kLanes;
    __m512 acc0[NT];
    for (int t = 0; t < NT; ++t) acc0[t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < d; ++k) {
      const __m512 a = _mm512_loadu_ps(x0 + k * kLanes);
      for (int t = 0; t < NT; ++t) acc0[t] = _mm512_fmadd_ps(a, _mm512_set1_ps(q[t][k * kLanes]), acc0[t]);
    }
    for (int t = 0; t < NT; ++t) maxima[t] = std::max(maxima[t], _mm512_reduce_max_ps(acc0[t]));
  }
}

constexpr int kLaneTokens = 12;  // tokens per pass: 24 accumulators + 2 row vectors + 1 broadcast

using LaneFn = void (*)(const float* const*, const float*, int64_t, int64_t, float*);
template <int... N>
constexpr std::array<LaneFn, sizeof...(N)> lane_table(std::integer_sequence<int, N...>) {
  return {&lane_maxima<N + 1>...};
}
constexpr auto kLaneFns = lane_table(std::make_integer_sequence<int, kLaneTokens>{});

// The score from a query's token maxima, summed as score_avx512 sums them: chunks of 32 tokens
// from the first, each chunk's lanes in double (sum_lanes), the chunks added in double.
float score_from_maxima(const float* maxima, int64_t len) {
  double total = 0.0;
  for (int64_t t = 0; t < len; t += 2 * kLanes) total += sum_lanes(maxima + t, std::min<int64_t>(len - t, 2 * kLanes));
  return static_cast<float>(total);
}

// One query against a transposed document by the lane kernel.
__attribute__((target("avx512f"))) float score_lanes(const PackedQueries& pq, int64_t qi, const float* xt,
                                                     int64_t rows, int64_t d, std::vector<float>& maxima) {
  const int64_t len = pq.length[qi];
  if (len == 0) return 0.0f;
  if (rows == 0) return kNegInf;
  const int64_t nb = (rows + kLanes - 1) / kLanes;
  maxima.resize(static_cast<size_t>(len));
  const float* first = pq.f32.data() + pq.block_start[qi] * d * kLanes;
  for (int64_t t0 = 0; t0 < len; t0 += kLaneTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kLaneTokens, len - t0));
    const float* q[kLaneTokens];
    for (int t = 0; t < n; ++t) q[t] = first + ((t0 + t) / kLanes) * d * kLanes + (t0 + t) % kLanes;
    kLaneFns[n - 1](q, xt, nb, d, maxima.data() + t0);
  }
  return score_from_maxima(maxima.data(), len);
}

// Estimated cost (in FMA instructions per coordinate) of scoring the queries of one run by the
// row tiles (rows rounded up to their tiles; the 8-lane kernel counted as a full one: measured,
// it is no faster per instruction here) and by the lane kernel (plus its transposition, ~5 per
// row block and coordinate). Ours, fitted to benchmarks/candidate_kernel.py (query lengths 4-32,
// 16-128 rows, AVX-512 EPYC): the lanes win up to ~24 tokens, the row tiles near 32. The choice
// changes speed only, never a score.
bool lanes_pay(const PackedQueries& pq, const int64_t* queries, int64_t n, int64_t rows) {
  const int64_t nb = (rows + kLanes - 1) / kLanes, tiles12 = (rows + 11) / 12 * 12, tiles24 = (rows + 23) / 24 * 24;
  double row_cost = 0.0, lane_tokens = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = pq.length[queries[i]], blocks = (len + kLanes - 1) / kLanes;
    lane_tokens += static_cast<double>(len);
    if (len <= kLanes / 2) row_cost += static_cast<double>(tiles12);  // the 8-lane kernel
    else row_cost += static_cast<double>(blocks / 2 * 2 * tiles12 + (blocks % 2) * tiles24);
  }
  return static_cast<double>(nb) * (lane_tokens + 5.0) < row_cost;
}

// COLGRAPH_CANDIDATE_KERNEL=rows|lanes forces one kernel (tests compare them); else the cost decides.
int forced_candidate_kernel() {
  const char* v = std::getenv("COLGRAPH_CANDIDATE_KERNEL");
  if (!v) return 0;
  if (std::strcmp(v, "rows") == 0) return 1;
  if (std::strcmp(v, "lanes") == 0) return 2;
  return 0;
}

}  // namespace

namespace {

// Several queries against every document, their tokens packed back to back into shared
// 16-lane blocks (a 12-token query no longer leaves 4 lanes idle, and most blocks run in the
// two-block kernel). Each query then sums its own tokens' maxima in the chunks and order
// the one-query kernel uses (32 tokens from the query's first token on AVX-512, 16 on AVX2; sum_lanes per chunk, chunks added
// in double), so every score is bit-identical to scoring the query alone.
// Lane maxima of every block of one packed query (all queries' tokens back to back) over a
// chunk of documents: maxima[(k * blocks + b) * 16 + l] for document k of the chunk. The pair
// loop is outermost so a pair of blocks stays in L1 while it meets every document.
template <bool BF16>
__attribute__((target("avx512f"))) void chunk_maxima(const PackedQueries& pq, const std::vector<DocRows>& rows,
                                                     int64_t d, float* maxima) {
  const int64_t blocks = pq.block_start[1], n = static_cast<int64_t>(rows.size());
  for (int64_t blk = 0; blk < blocks; blk += 2) {
    const bool two = blk + 1 < blocks;
    for (int64_t k = 0; k < n; ++k) {
      if (rows[k].rows == 0) continue;
      __m512 run[2];
      block_pair_maxima<BF16>(pq, blk, two, rows[k], d, run);
      float* m = maxima + (k * blocks + blk) * kLanes;
      _mm512_storeu_ps(m, run[0]);
      if (two) _mm512_storeu_ps(m + kLanes, run[1]);
    }
  }
}

// The AVX2 counterpart: one block at a time (16 lanes), the block outermost for the same reason.
__attribute__((target("avx2,fma"))) void chunk_maxima_avx2(const PackedQueries& pq, const std::vector<DocRows>& rows,
                                                           int64_t d, float* maxima) {
  const int64_t blocks = pq.block_start[1], n = static_cast<int64_t>(rows.size());
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t k = 0; k < n; ++k)
      if (rows[k].rows != 0) block_maxima_avx2(pq.f32.data() + blk * d * kLanes, rows[k], d, maxima + (k * blocks + blk) * kLanes);
}

void cross_packed(const PackedView& queries, const PackedView& docs, ElemType type, const Plan& plan,
                  float* out, int num_threads) {
  const int64_t nq = queries.n, nd = docs.n;
  const int64_t all_offsets[2] = {queries.offsets[0], queries.offsets[nq]};
  const PackedView all{queries.values, all_offsets, 1, queries.dim};
  const PackedQueries pq = pack_queries(all, type, plan.path == Path::Avx512BF16);
  const int64_t blocks = pq.block_start[1];
  const int64_t sum_chunk = plan.path == Path::Avx2F32 ? kLanes : 2 * kLanes;
  // Documents go in chunks of about 256 KiB of rows: a pair of query blocks stays in L1 while it
  // meets every document of the chunk, and the chunk stays in L2 while all pairs meet it (with
  // one document at a time, a large batch streamed all query blocks from L3 for every document).
  const int64_t elem = type == ElemType::F32 || plan.widen_docs ? 4 : 2;
  const int64_t doc_bytes = std::max<int64_t>(1, (docs.offsets[nd] - docs.offsets[0]) * docs.dim * elem / std::max<int64_t>(nd, 1));
  const int64_t chunk = std::clamp<int64_t>((256 << 10) / doc_bytes, 1, 64);
  const int64_t n_chunks = (nd + chunk - 1) / chunk;
  struct Scratch {
    std::vector<std::vector<float>> widened;
    std::vector<float> maxima;
  };
  parallel_tasks<Scratch>(n_chunks, num_threads, [&](int64_t c, Scratch& scratch) {
    const int64_t j0 = c * chunk, j1 = std::min(nd, j0 + chunk), n = j1 - j0;
    scratch.widened.resize(static_cast<size_t>(n));
    std::vector<DocRows> rows;
    rows.reserve(static_cast<size_t>(n));
    for (int64_t j = j0; j < j1; ++j) rows.push_back(doc_rows(docs, type, plan, j, scratch.widened[j - j0]));
    scratch.maxima.resize(static_cast<size_t>(n * blocks * kLanes));
    if (plan.path == Path::Avx512BF16)
      chunk_maxima<true>(pq, rows, docs.dim, scratch.maxima.data());
    else if (plan.path == Path::Avx2F32)
      chunk_maxima_avx2(pq, rows, docs.dim, scratch.maxima.data());
    else
      chunk_maxima<false>(pq, rows, docs.dim, scratch.maxima.data());
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j = j0 + k;
      const float* maxima = scratch.maxima.data() + k * blocks * kLanes;
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t first = queries.offsets[i] - queries.offsets[0], len = queries.offsets[i + 1] - queries.offsets[i];
        if (len == 0) {
          out[i * nd + j] = 0.0f;
        } else if (rows[k].rows == 0) {
          out[i * nd + j] = kNegInf;
        } else {
          double sum = 0.0;  // in the chunks the path's one-query kernel sums (32 tokens on AVX-512, 16 on AVX2)
          for (int64_t t = 0; t < len; t += sum_chunk)
            sum += sum_lanes(maxima + first + t, std::min<int64_t>(len - t, sum_chunk));
          out[i * nd + j] = static_cast<float>(sum);
        }
      }
    }
  });
}

}  // namespace

void maxsim_cross_cpu(const PackedView& queries, const PackedView& docs, ElemType type, float* out,
                      int num_threads) {
  const Plan plan = make_plan(type, docs.dim);
  const int64_t nq = queries.n, nd = docs.n;
  num_threads = threads_for_work((queries.offsets[nq] - queries.offsets[0]) * (docs.offsets[nd] - docs.offsets[0]) * docs.dim,
                                 num_threads);
  if (nq > 1 && plan.path != Path::Portable) {  // packed blocks: the SIMD paths
    cross_packed(queries, docs, type, plan, out, num_threads);
    return;
  }
  const PackedQueries pq = pack_queries(queries, type, plan.path == Path::Avx512BF16);
  parallel_tasks<std::vector<float>>(nd, num_threads, [&](int64_t j, std::vector<float>& scratch) {
    const DocRows doc = doc_rows(docs, type, plan, j, scratch);
    for (int64_t i = 0; i < nq; ++i) out[i * nd + j] = score_one(plan, pq, i, doc, docs.dim);
  });
}

void maxsim_candidates_cpu(const PackedView& queries, const PackedView& docs, ElemType type,
                           const int64_t* cand_offsets, const int64_t* cand_ids, int64_t n_cand,
                           float* out, int num_threads) {
  const Plan plan = make_plan(type, docs.dim);
  const PackedQueries pq = pack_queries(queries, type, plan.path == Path::Avx512BF16);
  // Regroup candidates by document so each listed document is read once.
  std::vector<int64_t> query_of(n_cand), order(n_cand);
  int64_t work = 0;  // multiply-adds, for the thread count (an id out of range is refused before this)
  for (int64_t i = 0; i < queries.n; ++i) {
    const int64_t q_len = queries.offsets[i + 1] - queries.offsets[i];
    for (int64_t c = cand_offsets[i]; c < cand_offsets[i + 1]; ++c) {
      query_of[c] = i;
      work += q_len * (docs.offsets[cand_ids[c] + 1] - docs.offsets[cand_ids[c]]) * docs.dim;
    }
  }
  num_threads = threads_for_work(work, num_threads);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cand_ids[a] < cand_ids[b]; });
  std::vector<int64_t> run_start;
  for (int64_t p = 0; p < n_cand; ++p)
    if (p == 0 || cand_ids[order[p]] != cand_ids[order[p - 1]]) run_start.push_back(p);
  run_start.push_back(n_cand);
  const int64_t runs = static_cast<int64_t>(run_start.size()) - 1;
  const int forced = forced_candidate_kernel();
  const bool lanes_ok = plan.path == Path::Avx512F32 && docs.dim % kLanes == 0 && forced != 1;
  struct Scratch {
    std::vector<float> widened, transposed, maxima;
    std::vector<int64_t> queries;
  };
  parallel_tasks<Scratch>(runs, num_threads, [&](int64_t r, Scratch& scratch) {
    const DocRows doc = doc_rows(docs, type, plan, cand_ids[order[run_start[r]]], scratch.widened);
    bool lanes = false;
    if (lanes_ok && doc.rows > 0) {
      scratch.queries.clear();
      for (int64_t p = run_start[r]; p < run_start[r + 1]; ++p) scratch.queries.push_back(query_of[order[p]]);
      lanes = forced == 2 || lanes_pay(pq, scratch.queries.data(), static_cast<int64_t>(scratch.queries.size()), doc.rows);
    }
    if (lanes) transpose_rows(doc, docs.dim, scratch.transposed);
    for (int64_t p = run_start[r]; p < run_start[r + 1]; ++p) {
      const int64_t c = order[p];
      out[c] = lanes ? score_lanes(pq, query_of[c], scratch.transposed.data(), doc.rows, docs.dim, scratch.maxima)
                     : score_one(plan, pq, query_of[c], doc, docs.dim);
    }
  });
}

std::string cpu_kernel_isa(ElemType type) {
  switch (make_plan(type, 2).path) {
    case Path::Avx512BF16: return "avx512bf16";
    case Path::Avx512F32: return "avx512f";
    case Path::Avx2F32: return "avx2";
    default: return "portable";
  }
}

}  // namespace colgraph
