// How fast this machine streams memory, measured the two ways pagedllm reads it (python -m pagedllm.bench.stream).
//
//   stream_probe read MB THREADS REPS     re-read one buffer of MB megabytes with vector loads: the read bandwidth,
//                                         from the caches for small buffers and from memory for large ones
//   stream_probe tiles PREFETCH THREADS REPS
//                                         the default model's 30 layers of projections as the AMX matmul walks them
//                                         (pairs of 16-output panels of 1 KB tiles, one run of pairs per thread), read
//                                         by tile loads (PREFETCH 1: each tile requested into L1 four steps ahead, as
//                                         amx_linear.cpp does; 0: not), with 300 MB read between passes
//
// Prints "best_ms MB GB/s". Built with -march=native; the tiles mode only where the compiler and CPU have AMX.
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
typedef long long vec __attribute__((vector_size(64)));  // a register's width of loads
#else
typedef long long vec __attribute__((vector_size(32)));
#endif
enum { kVecWords = sizeof(vec) / sizeof(long long) };

static volatile long long sink;  // what the loads read, kept so that the compiler keeps the loads

// OR of every word of x[0, count), count even.
static long long read_buffer(const vec* x, size_t count, int threads) {
  long long out = 0;
#pragma omp parallel num_threads(threads) reduction(| : out)
  {
    vec a = {0}, b = {0};
#pragma omp for schedule(static)
    for (size_t i = 0; i < count; i += 2) {
      a |= x[i];
      b |= x[i + 1];
    }
    for (int i = 0; i < kVecWords; ++i) out |= a[i] | b[i];
  }
  return out;
}

static double now(void) { return omp_get_wtime(); }

static int read_mode(size_t mb, int threads, int reps) {
  const size_t count = mb * 1024 * 1024 / sizeof(vec);
  vec* x = aligned_alloc(64, count * sizeof(vec));
  if (x == NULL) return 1;
  memset(x, 1, count * sizeof(vec));
  double best = 1e9;
  sink = read_buffer(x, count, threads);  // warm-up
  for (int r = 0; r < reps; ++r) {
    const double t = now();
    sink = read_buffer(x, count, threads);
    const double dt = now() - t;
    if (dt < best) best = dt;
  }
  printf("%.4f %zu %.2f\n", best * 1e3, mb, mb * 1.048576 / best / 1e3);
  free(x);
  return 0;
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// (outputs, inputs) of one layer's projections: fused q/k/v, o, fused gate/up, down
static const size_t kShapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
enum { kLayers = 30, kTileBytes = 1024, kAhead = 4 };

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

static void walk_tiles(const char* w, int prefetch, int threads) {
#pragma omp parallel num_threads(threads)
  {
    struct TileConfig config = {.palette = 1};
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
    static __thread char x[32 * 1536 * 2] __attribute__((aligned(64)));  // 32 rows of activations
    const int self = omp_get_thread_num(), team = omp_get_num_threads();
    size_t offset = 0;
    for (int layer = 0; layer < kLayers; ++layer)
      for (int m = 0; m < 4; ++m) {
        const size_t steps = kShapes[m][1] / 32, panel = steps * kTileBytes, pairs = kShapes[m][0] / 32;
        const char* weights = w + offset;
        offset += kShapes[m][0] * kShapes[m][1] * 2;
        for (size_t pair = pairs * self / team; pair < pairs * (self + 1) / team; ++pair) {
          const char* p = weights + pair * 2 * panel;
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (size_t s = 0; s < steps; ++s) {
            if (prefetch) {
              const char* ahead = p + (s + kAhead < steps ? s + kAhead : s + kAhead + steps) * kTileBytes;
              for (int line = 0; line < kTileBytes; line += 64) {
                _mm_prefetch(ahead + line, _MM_HINT_T0);
                _mm_prefetch(ahead + panel + line, _MM_HINT_T0);
              }
            }
            _tile_loadd(4, x + s * 64, kShapes[m][1] * 2);
            _tile_loadd(6, p + s * kTileBytes, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, p + panel + s * kTileBytes, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, x + 16 * kShapes[m][1] * 2 + s * 64, kShapes[m][1] * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
          static __thread float sums[4][256];
          _tile_stored(0, sums[0], 64);
          _tile_stored(1, sums[1], 64);
          _tile_stored(2, sums[2], 64);
          _tile_stored(3, sums[3], 64);
        }
#pragma omp barrier
      }
    _tile_release();
  }
}

static int tiles_mode(int prefetch, int threads, int reps) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
    fprintf(stderr, "the OS does not grant AMX tiles\n");
    return 2;
  }
  size_t bytes = 0;
  for (int m = 0; m < 4; ++m) bytes += kShapes[m][0] * kShapes[m][1] * 2;
  bytes *= kLayers;
  const size_t evict_count = (size_t)300 * 1024 * 1024 / sizeof(vec);
  char* w = aligned_alloc(4096, bytes);
  vec* evict = aligned_alloc(64, evict_count * sizeof(vec));
  if (w == NULL || evict == NULL) return 1;
  memset(w, 1, bytes);
  memset(evict, 2, evict_count * sizeof(vec));
  double best = 1e9;
  for (int r = 0; r <= reps; ++r) {
    sink = read_buffer(evict, evict_count, threads);  // the weights come from memory, as in a decode step
    const double t = now();
    walk_tiles(w, prefetch, threads);
    const double dt = now() - t;
    if (r > 0 && dt < best) best = dt;  // the first pass warms up
  }
  printf("%.4f %.1f %.2f\n", best * 1e3, bytes / 1048576.0, bytes / best / 1e9);
  free(w);
  free(evict);
  return 0;
}
#else
static int tiles_mode(int prefetch, int threads, int reps) {
  (void)prefetch;
  (void)threads;
  (void)reps;
  fprintf(stderr, "built without AMX\n");
  return 2;
}
#endif

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[1], "read") == 0) return read_mode(atol(argv[2]), atoi(argv[3]), atoi(argv[4]));
  if (argc == 5 && strcmp(argv[1], "tiles") == 0) return tiles_mode(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  fprintf(stderr, "usage: stream_probe read MB THREADS REPS | stream_probe tiles PREFETCH THREADS REPS\n");
  return 64;
}
