/* Small-M fp32 GEMM over a panel-packed weight: y[M, N] = x[M, K] @ W[N, K]^T.
 *
 * Built for the reference engine's verify steps (M = 1..17 rows), where the cost is
 * streaming the weight from memory: each weight value comes from DRAM once per call
 * and is multiplied into every row while it sits in L1, so checking 5 tokens streams
 * the same bytes as checking one.
 *
 * Layout: W [N, K] is packed into panels of 16 output columns, panel p = [K][16]
 * contiguous (packed[p][k][j] = W[16 p + j][k], zero past N).
 *
 * Schedule: GROUP panels at a time (6 separate memory streams: one stream alone does
 * not keep enough cache misses in flight on this class of CPU; six measured ~1.5x
 * faster), in blocks of K_BLOCK values of k. Within a block every row is run over
 * the group (12 accumulators in registers); rows after the first re-read the block
 * from L1 while the next block is prefetched.
 *
 * Exactness: every output y[m, n] is ONE fused-multiply-add chain over k = 0 .. K-1
 * in increasing order, started from 0 (between blocks the running value is stored
 * and reloaded, which is exact), whatever M is and however rows, panels and blocks
 * are grouped. So a row's result is bitwise the same whether the call carries 1 row
 * or 17: a verify step computes exactly what one-token decoding computes.
 *
 * Threads: for calls of PARALLEL_MIN_ROWS rows or more (prefill), groups are shared out
 * dynamically among `threads` OpenMP threads (otherwise no parallel region; torch's own libgomp is the one loaded, so one thread pool serves both).
 * Compiled without a global -mavx2: only the kernels carry the target attribute, and
 * bs_panel_cpu_ok() says whether the running CPU has AVX2 and FMA.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define PANEL 16
/* Threads only for calls of at least this many rows (prefill): a decoding or verify step
 * (1..17 rows) stays on one thread. On a machine whose cores are busy (Triton's other
 * model processes, the clients) every parallel region waits for a descheduled thread,
 * which made whole test runs several times slower; one thread already streams the weights. */
#define PARALLEL_MIN_ROWS 64
#define GROUP 6
#ifndef K_BLOCK
#define K_BLOCK 16 /* 6 panels x 16 k x 64 B = 6 KiB: stays in L1 across the rows */
#endif

int bs_panel_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int bs_panel_width(void) { return PANEL; }

/* Floats from one panel's start to the next: 16 K rounded so that consecutive panels
 * start PAD_LINES cache lines apart modulo 4 KiB (16 K floats is often a multiple of
 * 4 KiB, which would put the six streams of a group on the same L1 sets). */
#ifndef PAD_LINES
#define PAD_LINES 1
#endif
int64_t bs_panel_stride(int64_t K) {
    int64_t stride = K * PANEL;
    if ((stride * 4) % 4096 == 0) stride += PAD_LINES * 16;
    return stride;
}

/* Accumulator pair j (16 columns of panel j) of one row. */
#define ACC_INIT(j)                                                                      \
    __m256 lo##j, hi##j;                                                                 \
    if (first) {                                                                         \
        lo##j = _mm256_setzero_ps();                                                     \
        hi##j = _mm256_setzero_ps();                                                     \
    } else {                                                                             \
        lo##j = _mm256_loadu_ps(acc + (j) * PANEL);                                      \
        hi##j = _mm256_loadu_ps(acc + (j) * PANEL + 8);                                  \
    }
#define ACC_FMA(j)                                                                       \
    lo##j = _mm256_fmadd_ps(b, _mm256_loadu_ps(p##j + k * PANEL), lo##j);                \
    hi##j = _mm256_fmadd_ps(b, _mm256_loadu_ps(p##j + k * PANEL + 8), hi##j);
#define ACC_STORE(j)                                                                     \
    _mm256_storeu_ps(acc + (j) * PANEL, lo##j);                                          \
    _mm256_storeu_ps(acc + (j) * PANEL + 8, hi##j);
#ifndef PF_BLOCKS
#define PF_BLOCKS 1
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
#ifndef PF_ROW
#define PF_ROW 1
#endif
#define PREFETCH(j) _mm_prefetch((const char *)(p##j + (k + PF_BLOCKS * K_BLOCK) * PANEL), PF_HINT);

/* One row over k in [k0, k1) of a full group of GROUP panels starting at `panel`;
 * acc: this row's running values, GROUP * 16 floats. */
__attribute__((target("avx2,fma"))) static void group_row(
    const float *x, const float *panel, int64_t stride, int64_t K, int64_t k0, int64_t k1,
    float *acc, int first, int prefetch) {
    const float *p0 = panel, *p1 = p0 + stride, *p2 = p1 + stride;
    const float *p3 = p2 + stride, *p4 = p3 + stride, *p5 = p4 + stride;
    ACC_INIT(0) ACC_INIT(1) ACC_INIT(2) ACC_INIT(3) ACC_INIT(4) ACC_INIT(5)
    if (prefetch) {
        for (int64_t k = k0; k < k1; ++k) {
            const __m256 b = _mm256_broadcast_ss(x + k);
            if (k + PF_BLOCKS * K_BLOCK < K) { PREFETCH(0) PREFETCH(1) PREFETCH(2) PREFETCH(3) PREFETCH(4) PREFETCH(5) }
            ACC_FMA(0) ACC_FMA(1) ACC_FMA(2) ACC_FMA(3) ACC_FMA(4) ACC_FMA(5)
        }
    } else {
        for (int64_t k = k0; k < k1; ++k) {
            const __m256 b = _mm256_broadcast_ss(x + k);
            ACC_FMA(0) ACC_FMA(1) ACC_FMA(2) ACC_FMA(3) ACC_FMA(4) ACC_FMA(5)
        }
    }
    ACC_STORE(0) ACC_STORE(1) ACC_STORE(2) ACC_STORE(3) ACC_STORE(4) ACC_STORE(5)
}

/* The same for a single panel (groups at the end with fewer than GROUP panels). */
__attribute__((target("avx2,fma"))) static void panel_row(
    const float *x, const float *panel, int64_t k0, int64_t k1, float *acc, int first) {
    const float *p0 = panel;
    ACC_INIT(0)
    for (int64_t k = k0; k < k1; ++k) {
        const __m256 b = _mm256_broadcast_ss(x + k);
        ACC_FMA(0)
    }
    ACC_STORE(0)
}

#define ROWS_PER_PASS 32 /* rows whose running values are kept per pass (32 x 384 B on the stack) */

/* Panels [p_begin, p_end) (at most GROUP) for every row. */
__attribute__((target("avx2,fma"))) static void one_group(
    const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t stride,
    int64_t N, float *y, int64_t ldy, int64_t p_begin, int64_t p_end) {
    float acc[ROWS_PER_PASS][GROUP * PANEL];
    const int64_t count = p_end - p_begin;
    const float *panel = packed + p_begin * stride;
    for (int64_t m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        const int64_t rows = (M - m0) < ROWS_PER_PASS ? (M - m0) : ROWS_PER_PASS;
        for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK) {
            const int64_t k1 = (k0 + K_BLOCK) < K ? (k0 + K_BLOCK) : K;
            for (int64_t r = 0; r < rows; ++r) {
                const float *xr = x + (m0 + r) * ldx;
                if (count == GROUP) {
                    group_row(xr, panel, stride, K, k0, k1, acc[r], k0 == 0, rows > 1 && r == PF_ROW);
                } else {
                    for (int64_t j = 0; j < count; ++j)
                        panel_row(xr, panel + j * stride, k0, k1, acc[r] + j * PANEL, k0 == 0);
                }
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t n0 = p_begin * PANEL;
            const int64_t width = (N - n0) < count * PANEL ? (N - n0) : count * PANEL;
            memcpy(y + (m0 + r) * ldy + n0, acc[r], (size_t)width * sizeof(float));
        }
    }
}

/* y[m, n] for m < M, n < N. x: [M, K] with row stride ldx; packed: ceil(N / 16)
 * panels of [K][16], panel p starting at packed + p * stride (stride >= 16 K floats;
 * bs_panel_stride() gives the padded stride that keeps panels off the same cache
 * sets); y: [M, N] with row stride ldy. */
__attribute__((target("avx2,fma"))) void bs_panel_gemm(
    const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t stride,
    int64_t N, float *y, int64_t ldy, int threads) {
    const int64_t panels = (N + PANEL - 1) / PANEL;
    const int64_t groups = (panels + GROUP - 1) / GROUP;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && M >= PARALLEL_MIN_ROWS)
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t p_begin = g * GROUP;
        const int64_t p_end = (p_begin + GROUP) < panels ? (p_begin + GROUP) : panels;
        one_group(x, M, K, ldx, packed, stride, N, y, ldy, p_begin, p_end);
    }
}

/* ---- attention ------------------------------------------------------------------
 * out[b, t, h, :] = softmax_j(scale * q[b, h, t, :] . k[b, h / G, j, :]) v[b, h / G, j, :]
 * over keys j in [lo[b T + t], hi[b T + t]), G = H / KVH (grouped-query attention).
 *
 * Exactness: every reduction runs in one fixed order that depends only on the key range:
 * each dot product is 8 FMA lanes over d (d = 0..D-1 in steps of 8) summed lane 0..7;
 * the softmax takes the max, then the sum of expf in increasing j; the output is one FMA
 * chain per lane over increasing j, divided by the sum at the end. So a query row's
 * result is bitwise the same however many rows the call carries and wherever its keys
 * sit in the (left-padded) cache: a verify step, one-token decoding and a batched step
 * compute the same values.
 *
 * q: element (b, h, t, d) at q[b qsb + h qsh + t qst + d]; k, v: [B, KVH, L, D]
 * contiguous; out: [B, T, H, D] contiguous; D a multiple of 8.
 */
#include <math.h>
#include <stdlib.h>

__attribute__((target("avx2,fma"))) static inline float hsum_fixed(__m256 acc) {
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float s = lanes[0];
    for (int i = 1; i < 8; ++i) s += lanes[i];
    return s;
}

/* scores[j] = scale * (q . keys[j]) for j in [j0, j1); four keys at a time (four
 * independent chains; each key's own order is unchanged). */
__attribute__((target("avx2,fma"))) static void scores_fixed(
    const float *q, const float *keys, int64_t j0, int64_t j1, int64_t D, float scale, float *scores) {
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
        const float *k0 = keys + j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            const __m256 qd = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k3 + d), a3);
        }
        scores[j] = hsum_fixed(a0) * scale;
        scores[j + 1] = hsum_fixed(a1) * scale;
        scores[j + 2] = hsum_fixed(a2) * scale;
        scores[j + 3] = hsum_fixed(a3) * scale;
    }
    for (; j < j1; ++j) {
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(keys + j * D + d), a0);
        scores[j] = hsum_fixed(a0) * scale;
    }
}

/* o[:] = sum_j weights[j] values[j, :] / sum, one chain per lane in increasing j
 * (D = 64: all eight lanes' chains in flight together). */
__attribute__((target("avx2,fma"))) static void weighted_sum_fixed(
    const float *weights, const float *values, int64_t j0, int64_t j1, int64_t D, float sum, float *o) {
    const __m256 inv = _mm256_set1_ps(sum);
    if (D == 64) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t j = j0; j < j1; ++j) {
            const __m256 w = _mm256_set1_ps(weights[j]);
            const float *vr = values + j * 64;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 24), a3);
            a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 32), a4);
            a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 40), a5);
            a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 48), a6);
            a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 56), a7);
        }
        _mm256_storeu_ps(o, _mm256_div_ps(a0, inv));
        _mm256_storeu_ps(o + 8, _mm256_div_ps(a1, inv));
        _mm256_storeu_ps(o + 16, _mm256_div_ps(a2, inv));
        _mm256_storeu_ps(o + 24, _mm256_div_ps(a3, inv));
        _mm256_storeu_ps(o + 32, _mm256_div_ps(a4, inv));
        _mm256_storeu_ps(o + 40, _mm256_div_ps(a5, inv));
        _mm256_storeu_ps(o + 48, _mm256_div_ps(a6, inv));
        _mm256_storeu_ps(o + 56, _mm256_div_ps(a7, inv));
        return;
    }
    for (int64_t d = 0; d < D; d += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = j0; j < j1; ++j)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[j]), _mm256_loadu_ps(values + j * D + d), acc);
        _mm256_storeu_ps(o + d, _mm256_div_ps(acc, inv));
    }
}

__attribute__((target("avx2,fma"))) void bs_attention(
    const float *q, int64_t qsb, int64_t qsh, int64_t qst, const float *k, const float *v,
    const int64_t *lo, const int64_t *hi, float *out, int64_t B, int64_t H, int64_t KVH,
    int64_t T, int64_t L, int64_t D, float scale, int threads) {
    const int64_t G = H / KVH;
    const int64_t jobs = B * H * T;
#pragma omp parallel num_threads(threads) if (threads > 1 && T >= PARALLEL_MIN_ROWS)
    {
        float *scores = (float *)malloc((size_t)(L > 0 ? L : 1) * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t job = 0; job < jobs; ++job) {
            const int64_t b = job / (H * T), h = (job / T) % H, t = job % T;
            const int64_t j0 = lo[b * T + t], j1 = hi[b * T + t];
            const float *qr = q + b * qsb + h * qsh + t * qst;
            const float *kb = k + (b * KVH + h / G) * L * D;
            const float *vb = v + (b * KVH + h / G) * L * D;
            float *o = out + ((b * T + t) * H + h) * D;
            scores_fixed(qr, kb, j0, j1, D, scale, scores);
            float m = -INFINITY;
            for (int64_t j = j0; j < j1; ++j)
                if (scores[j] > m) m = scores[j];
            float sum = 0.0f;
            for (int64_t j = j0; j < j1; ++j) {
                scores[j] = expf(scores[j] - m);
                sum += scores[j];
            }
            weighted_sum_fixed(scores, vb, j0, j1, D, sum, o);
        }
        free(scores);
    }
}
