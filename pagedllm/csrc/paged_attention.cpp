// Paged attention for a mixed batch, reading K and V through the block tables where they lie.
//
// Work is cut into tiles: (sequence, KV head, run of consecutive new tokens). A tile's rows are its tokens
// times the query heads of the KV head's group, so every key row is loaded once for all of them (GQA of any
// ratio). A tile walks its keys [0, num_cached + last token] in runs of kKeyTile positions, keeping an
// online softmax per row in float32: running max m, running sum l, unnormalised output acc. Rows only see
// keys up to their own position (causal over the cached prefix plus the new tokens).
//
// When there are too few tiles to keep every thread busy (a few long decodes), a tile's key range is
// split into parts that run on different threads; each part leaves (m, l, acc) and the parts are merged
// with the exact rule of pagedllm/attention/merge.py: M = max m_p, w_p = exp(m_p - M),
// out = sum_p w_p acc_p / sum_p w_p l_p.
#include "paged_attention.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "parallel.h"
#include "vec.h"

namespace pagedllm {
namespace {

constexpr int64_t kKeyTile = 16;          // keys scored together
constexpr int64_t kRowsPerTile = 48;      // target rows (tokens x group heads) of one tile
constexpr int64_t kTransposeMinRows = 8;  // from this many rows on, a transposed key tile pays for itself
constexpr int64_t kAutoPartition = 256;   // keys per part when splitting for idle threads
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Tile {
  int64_t seq, kv_head;
  int64_t token_begin, token_end;  // new tokens of the sequence, counted from its first new token
  int64_t first_key_pos;           // absolute position of token_begin (= the sequence's cached keys + token_begin)
  int64_t num_parts, first_slot;   // first_slot: its parts' partials in the scratch buffer (-1: not split)
};

struct Part {
  int64_t tile, key_begin, key_end, slot;  // slot -1: write the normalised output directly
};

struct WorkList {
  std::vector<Tile> tiles;
  std::vector<Part> parts;
  int64_t num_slots = 0;
  int64_t max_rows = 0;
};

int64_t group_size(const PagedAttentionArgs& a) { return a.num_heads / a.num_kv_heads; }

std::vector<Tile> make_tiles(const PagedAttentionArgs& a) {
  const int64_t group = group_size(a);
  const int64_t tokens_per_tile = std::max<int64_t>(1, kRowsPerTile / group);
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t query_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    const int64_t num_cached = a.seq_lens[s] - query_len;
    for (int64_t t0 = 0; t0 < query_len; t0 += tokens_per_tile) {
      const int64_t t1 = std::min(query_len, t0 + tokens_per_tile);
      for (int64_t h = 0; h < a.num_kv_heads; ++h) tiles.push_back({s, h, t0, t1, num_cached + t0, 1, -1});
    }
  }
  return tiles;
}

int64_t choose_partition(const PagedAttentionArgs& a, int64_t num_tiles) {
  if (a.partition_size > 0) return a.partition_size;
  if (num_tiles >= 4 * static_cast<int64_t>(at::get_num_threads())) return 0;  // enough tiles already
  return std::max<int64_t>(a.block_size, kAutoPartition / a.block_size * a.block_size);
}

WorkList make_work(const PagedAttentionArgs& a) {
  WorkList w;
  w.tiles = make_tiles(a);
  const int64_t partition = choose_partition(a, static_cast<int64_t>(w.tiles.size()));
  const int64_t group = group_size(a);
  for (int64_t i = 0; i < static_cast<int64_t>(w.tiles.size()); ++i) {
    Tile& t = w.tiles[i];
    w.max_rows = std::max(w.max_rows, (t.token_end - t.token_begin) * group);
    const int64_t key_end = t.first_key_pos + (t.token_end - t.token_begin);
    t.num_parts = partition > 0 ? (key_end + partition - 1) / partition : 1;
    if (t.num_parts == 1) {
      w.parts.push_back({i, 0, key_end, -1});
      continue;
    }
    t.first_slot = w.num_slots;
    for (int64_t p = 0; p < t.num_parts; ++p)
      w.parts.push_back({i, p * partition, std::min(key_end, (p + 1) * partition), w.num_slots++});
  }
  // Longest first, so that no thread is left with one long part at the end.
  std::stable_sort(w.parts.begin(), w.parts.end(), [&](const Part& x, const Part& y) {
    return x.key_end - x.key_begin > y.key_end - y.key_begin;
  });
  return w;
}

struct Scratch {
  std::vector<float> q, m, l, acc, scores, keys_t, k_rows, v_rows;
  std::vector<int64_t> limit;
  const float* k_ptr[kKeyTile];  // the current key tile's rows, as float32 (the cache itself, or converted)
  const float* v_ptr[kKeyTile];
};

Scratch& thread_scratch(int64_t rows, int64_t dim) {
  thread_local Scratch s;
  s.q.resize(rows * dim);
  s.acc.resize(rows * dim);
  s.m.resize(rows);
  s.l.resize(rows);
  s.limit.resize(rows);
  s.scores.resize(rows * kKeyTile);
  s.keys_t.resize(dim * kKeyTile);
  s.k_rows.resize(kKeyTile * dim);
  s.v_rows.resize(kKeyTile * dim);
  return s;
}

// One instantiation per cache dtype T and head dim (kDim = 0: any head dim, known at run time).
template <typename T, int kDim>
class Kernel {
 public:
  explicit Kernel(const PagedAttentionArgs& a)
      : a_(a), dim_(kDim > 0 ? kDim : a.head_dim), group_(group_size(a)),
        cache_(static_cast<const T*>(a.kv_cache)),
        value_offset_(a.num_kv_heads * a.num_blocks * a.block_size * (kDim > 0 ? kDim : a.head_dim)) {}

  void run() {
    const WorkList w = make_work(a_);
    const int64_t slot_stride = w.max_rows * (dim_ + 2);
    std::vector<float> partials(w.num_slots * slot_stride);
    parallel_dynamic(static_cast<int64_t>(w.parts.size()), [&](int64_t i) {
      const Part& p = w.parts[i];
      float* partial = p.slot >= 0 ? partials.data() + p.slot * slot_stride : nullptr;
      run_part(w.tiles[p.tile], p.key_begin, p.key_end, partial);
    });
    if (w.num_slots == 0) return;
    std::vector<int64_t> split;
    for (int64_t i = 0; i < static_cast<int64_t>(w.tiles.size()); ++i)
      if (w.tiles[i].num_parts > 1) split.push_back(i);
    parallel_dynamic(static_cast<int64_t>(split.size()), [&](int64_t i) {
      const Tile& t = w.tiles[split[i]];
      merge_parts(t, partials.data() + t.first_slot * slot_stride, slot_stride);
    });
  }

 private:
  const PagedAttentionArgs& a_;
  const int64_t dim_, group_;
  const T* cache_;
  const int64_t value_offset_;

  int64_t rows(const Tile& t) const { return (t.token_end - t.token_begin) * group_; }
  int64_t token_index(const Tile& t, int64_t r) const {
    return a_.query_start_loc[t.seq] + t.token_begin + r / group_;
  }
  int64_t head_index(const Tile& t, int64_t r) const { return t.kv_head * group_ + r % group_; }

  void run_part(const Tile& t, int64_t key_begin, int64_t key_end, float* partial) {
    const int64_t num_rows = rows(t);
    Scratch& s = thread_scratch(num_rows, dim_);
    load_queries(t, s);
    for (int64_t key0 = key_begin; key0 < key_end; key0 += kKeyTile) {
      // rows are ordered by position: rows before `first` cannot see key0 or anything after it
      const int64_t first = std::max<int64_t>(0, key0 - t.first_key_pos) * group_;
      if (first >= num_rows) break;
      const int64_t n = std::min(kKeyTile, key_end - key0);
      load_keys(t, key0, n, s);
      score(s, first, num_rows, n);
      update(s, first, num_rows, key0, n);
    }
    if (partial != nullptr)
      save_partial(s, num_rows, partial);
    else
      write_rows(t, s.acc.data(), s.l.data(), num_rows);
  }

  void load_queries(const Tile& t, Scratch& s) {
    const T* query = static_cast<const T*>(a_.query);
    for (int64_t r = 0; r < rows(t); ++r) {
      const T* src = query + token_index(t, r) * a_.query_token_stride + head_index(t, r) * dim_;
      float* dst = s.q.data() + r * dim_;
      for (int64_t d = 0; d < dim_; ++d) dst[d] = to_float(src[d]) * a_.scale;
      s.limit[r] = t.first_key_pos + r / group_;
      s.m[r] = kNegInf;
      s.l[r] = 0.0f;
    }
    std::fill(s.acc.begin(), s.acc.begin() + rows(t) * dim_, 0.0f);
  }

  // Point s.k_ptr/s.v_ptr at key rows key0 .. key0+n-1 (float32 rows: the cache itself or converted copies).
  void load_keys(const Tile& t, int64_t key0, int64_t n, Scratch& s) {
    const int64_t* table = a_.block_tables + t.seq * a_.block_table_width;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = key0 + j;
      const int64_t block = table[pos / a_.block_size];
      const T* k = cache_ + ((t.kv_head * a_.num_blocks + block) * a_.block_size + pos % a_.block_size) * dim_;
      const T* v = k + value_offset_;
      if constexpr (std::is_same_v<T, float>) {
        s.k_ptr[j] = k;
        s.v_ptr[j] = v;
      } else {
        float* kf = s.k_rows.data() + j * dim_;
        float* vf = s.v_rows.data() + j * dim_;
        for (int64_t d = 0; d < dim_; ++d) kf[d] = to_float(k[d]);
        for (int64_t d = 0; d < dim_; ++d) vf[d] = to_float(v[d]);
        s.k_ptr[j] = kf;
        s.v_ptr[j] = vf;
      }
    }
  }

  // scores[r][j] = q_r . k_j for rows [first, num_rows)
  void score(Scratch& s, int64_t first, int64_t num_rows, int64_t n) {
    if (num_rows - first < kTransposeMinRows) {
      for (int64_t r = first; r < num_rows; ++r)
        for (int64_t j = 0; j < n; ++j) s.scores[r * kKeyTile + j] = dot(s.q.data() + r * dim_, s.k_ptr[j]);
      return;
    }
    float* kt = s.keys_t.data();  // [dim][kKeyTile]: one vector of keys per query element
    for (int64_t j = 0; j < kKeyTile; ++j)
      for (int64_t d = 0; d < dim_; ++d) kt[d * kKeyTile + j] = j < n ? s.k_ptr[j][d] : 0.0f;
    int64_t r = first;
    for (; r + 4 <= num_rows; r += 4) score4(s.q.data() + r * dim_, kt, s.scores.data() + r * kKeyTile);
    for (; r < num_rows; ++r) score1(s.q.data() + r * dim_, kt, s.scores.data() + r * kKeyTile);
  }

  float dot(const float* x, const float* y) const {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < dim_; ++d) sum += x[d] * y[d];
    return sum;
  }

  void score4(const float* q, const float* kt, float* out) const {
    float s0[kKeyTile] = {}, s1[kKeyTile] = {}, s2[kKeyTile] = {}, s3[kKeyTile] = {};
    for (int64_t d = 0; d < dim_; ++d) {
      const float* k = kt + d * kKeyTile;
      const float q0 = q[d], q1 = q[dim_ + d], q2 = q[2 * dim_ + d], q3 = q[3 * dim_ + d];
#pragma omp simd
      for (int64_t j = 0; j < kKeyTile; ++j) {
        s0[j] += q0 * k[j];
        s1[j] += q1 * k[j];
        s2[j] += q2 * k[j];
        s3[j] += q3 * k[j];
      }
    }
    for (int64_t j = 0; j < kKeyTile; ++j) {
      out[j] = s0[j];
      out[kKeyTile + j] = s1[j];
      out[2 * kKeyTile + j] = s2[j];
      out[3 * kKeyTile + j] = s3[j];
    }
  }

  void score1(const float* q, const float* kt, float* out) const {
    float s0[kKeyTile] = {};
    for (int64_t d = 0; d < dim_; ++d) {
      const float* k = kt + d * kKeyTile;
      const float q0 = q[d];
#pragma omp simd
      for (int64_t j = 0; j < kKeyTile; ++j) s0[j] += q0 * k[j];
    }
    for (int64_t j = 0; j < kKeyTile; ++j) out[j] = s0[j];
  }

  // Online softmax step over keys key0 .. key0+n-1, then acc += p @ v.
  void update(Scratch& s, int64_t first, int64_t num_rows, int64_t key0, int64_t n) {
    for (int64_t r = first; r < num_rows; ++r) {
      const int64_t valid = std::min(n, s.limit[r] - key0 + 1);
      float* p = s.scores.data() + r * kKeyTile;
      float tile_max = kNegInf;
      for (int64_t j = 0; j < valid; ++j) tile_max = std::max(tile_max, p[j]);
      const float new_max = std::max(s.m[r], tile_max);
      const float alpha = fast_exp(s.m[r] - new_max);
      float sum = 0.0f;
      for (int64_t j = 0; j < valid; ++j) {
        p[j] = fast_exp(p[j] - new_max);
        sum += p[j];
      }
      s.l[r] = s.l[r] * alpha + sum;
      s.m[r] = new_max;
      accumulate(s.acc.data() + r * dim_, alpha, p, valid, s.v_ptr);
    }
  }

  void accumulate(float* acc, float alpha, const float* p, int64_t valid, const float* const* v_rows) const {
    if constexpr (kDim > 0) {
      float reg[kDim];  // kept in vector registers across the keys
      for (int64_t d = 0; d < kDim; ++d) reg[d] = acc[d] * alpha;
      for (int64_t j = 0; j < valid; ++j) {
        const float pj = p[j];
        const float* v = v_rows[j];
#pragma omp simd
        for (int64_t d = 0; d < kDim; ++d) reg[d] += pj * v[d];
      }
      for (int64_t d = 0; d < kDim; ++d) acc[d] = reg[d];
    } else {
      for (int64_t d = 0; d < dim_; ++d) acc[d] *= alpha;
      for (int64_t j = 0; j < valid; ++j) {
        const float pj = p[j];
        const float* v = v_rows[j];
#pragma omp simd
        for (int64_t d = 0; d < dim_; ++d) acc[d] += pj * v[d];
      }
    }
  }

  // partial layout per row: acc [dim], then m, then l
  void save_partial(const Scratch& s, int64_t num_rows, float* partial) const {
    for (int64_t r = 0; r < num_rows; ++r) {
      float* row = partial + r * (dim_ + 2);
      std::copy(s.acc.begin() + r * dim_, s.acc.begin() + (r + 1) * dim_, row);
      row[dim_] = s.m[r];
      row[dim_ + 1] = s.l[r];
    }
  }

  void merge_parts(const Tile& t, const float* partials, int64_t slot_stride) {
    const int64_t num_rows = rows(t);
    std::vector<float> acc(num_rows * dim_, 0.0f), sums(num_rows, 0.0f);
    for (int64_t r = 0; r < num_rows; ++r) {
      float big_m = kNegInf;
      for (int64_t p = 0; p < t.num_parts; ++p) big_m = std::max(big_m, partials[p * slot_stride + r * (dim_ + 2) + dim_]);
      float* out = acc.data() + r * dim_;
      for (int64_t p = 0; p < t.num_parts; ++p) {
        const float* row = partials + p * slot_stride + r * (dim_ + 2);
        const float w = fast_exp(row[dim_] - big_m);  // 0 for a part the row saw no key of (m = -inf)
        sums[r] += w * row[dim_ + 1];
#pragma omp simd
        for (int64_t d = 0; d < dim_; ++d) out[d] += w * row[d];
      }
    }
    write_rows(t, acc.data(), sums.data(), num_rows);
  }

  void write_rows(const Tile& t, const float* acc, const float* sums, int64_t num_rows) const {
    T* out = static_cast<T*>(a_.out);
    for (int64_t r = 0; r < num_rows; ++r) {
      T* dst = out + (token_index(t, r) * a_.num_heads + head_index(t, r)) * dim_;
      const float inv = 1.0f / sums[r];  // every row sees at least its own key, so sums[r] > 0
      for (int64_t d = 0; d < dim_; ++d) store(dst + d, acc[r * dim_ + d] * inv);
    }
  }
};

template <typename T>
void dispatch(const PagedAttentionArgs& a) {
  switch (a.head_dim) {
    case 64: Kernel<T, 64>(a).run(); break;
    case 128: Kernel<T, 128>(a).run(); break;
    default: Kernel<T, 0>(a).run(); break;
  }
}

}  // namespace

void paged_attention_f32(const PagedAttentionArgs& args) { dispatch<float>(args); }
void paged_attention_bf16(const PagedAttentionArgs& args) { dispatch<bf16_t>(args); }

}  // namespace pagedllm
