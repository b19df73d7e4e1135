/* Products of a few float32 rows by a weight, reading the weight once: drift.models.row_kernel.
 *
 * y[j, o] = sum_i x[j, i] * w[o, i] (+ b[o]) for j < m rows of x [m, n] and w [o_count, n],
 * both row-major. Each weight row is read once, from memory, as one stream, and multiplied by
 * up to C rows of x at a time (x stays in the L1 cache). The weight's rows are split across
 * `threads` OpenMP threads (torch's own runtime: the library links libgomp.so.1, the soname
 * torch's copy has). Vector width: the compiler's for the CPU it is built on (-march=native):
 * 16 floats with AVX-512, 8 with AVX, 4 otherwise (SSE, NEON).
 */
#include <string.h>

#if defined(__AVX512F__)
#define VB 64
#elif defined(__AVX__)
#define VB 32
#else
#define VB 16
#endif
#define VW (VB / 4)
#define C 4 /* rows of x multiplied per pass over a weight row */

typedef float vf __attribute__((vector_size(VB)));

static inline vf load(const float* p) {
  vf v;
  memcpy(&v, p, VB);
  return v;
}

static inline float lanes(vf v) {
  float s = 0.f;
  for (int l = 0; l < VW; l++) s += v[l];
  return s;
}

/* rows m0 .. m0 + c - 1 of x times weight row o (c a constant where inlined) */
static inline __attribute__((always_inline)) void chunk(const float* w, const float* x, float* y,
                                                        const float* b, long n, long o_count,
                                                        long o, long m0, const int c) {
  vf acc[C];
  for (int j = 0; j < c; j++) acc[j] = (vf){0};
  const float* wr = w + o * n;
  long k = 0;
  for (; k + VW <= n; k += VW) {
    vf wv = load(wr + k);
    for (int j = 0; j < c; j++) acc[j] += wv * load(x + (m0 + j) * n + k);
  }
  for (int j = 0; j < c; j++) {
    float s = lanes(acc[j]);
    for (long t = k; t < n; t++) s += wr[t] * x[(m0 + j) * n + t];
    y[(m0 + j) * o_count + o] = b ? s + b[o] : s;
  }
}

static void row(const float* w, const float* x, float* y, const float* b, long m, long n,
                long o_count, long o) {
  long m0 = 0;
  for (; m0 + C <= m; m0 += C) chunk(w, x, y, b, n, o_count, o, m0, C);
  switch (m - m0) {
    case 3: chunk(w, x, y, b, n, o_count, o, m0, 3); break;
    case 2: chunk(w, x, y, b, n, o_count, o, m0, 2); break;
    case 1: chunk(w, x, y, b, n, o_count, o, m0, 1); break;
    default: break;
  }
}

int drift_rows_lanes(void) { return VW; }

void drift_rows(const float* w, const float* x, float* y, const float* b, long m, long n,
                long o_count, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (long o = 0; o < o_count; o++) row(w, x, y, b, m, n, o_count, o);
}
