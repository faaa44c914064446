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
 * faster), in blocks of K_BLOCK values of k. Within a block the first row runs over the
 * whole group alone (12 accumulators in registers; it streams the block from memory),
 * then the other rows two at a time, three panels at a time (12 accumulators; every
 * weight vector loaded once for both rows: ~1.5x the FMA rate of one row, whose loads
 * were the limit). Those later passes re-read the block from L1 and share out, panel by
 * panel, the prefetch of the next block, so memory keeps streaming while they compute.
 *
 * Exactness: every output y[m, n] is ONE fused-multiply-add chain over k = 0 .. K-1
 * in increasing order, started from 0 (between blocks the running value is stored
 * and reloaded, which is exact), whatever M is and however rows, panels and blocks
 * are grouped. So a row's result is bitwise the same whether the call carries 1 row
 * or 17: a verify step computes exactly what one-token decoding computes.
 *
 * Threads: for calls of PARALLEL_MIN_ROWS rows or more (prefill), groups are shared out
 * dynamically among `threads` OpenMP threads (otherwise no parallel region; torch's own
 * libgomp is the one loaded, so one thread pool serves both).
 *
 * bs_panel_cpu_ok() says whether the running CPU has AVX2 and FMA (every kernel of the
 * library needs both); the AVX-512 GEMM further down runs where the CPU has AVX-512F.
 */
#include "common.h"

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

/* One row over k in [k0, k1) of a full group of GROUP panels starting at `panel`;
 * acc: this row's running values, GROUP * 16 floats. */
__attribute__((target("avx2,fma"))) static void group_row(
    const float *x, const float *panel, int64_t stride, int64_t k0, int64_t k1,
    float *acc, int first, const float *const *pf, int npf) {
    const float *p0 = panel, *p1 = p0 + stride, *p2 = p1 + stride;
    const float *p3 = p2 + stride, *p4 = p3 + stride, *p5 = p4 + stride;
    ACC_INIT(0) ACC_INIT(1) ACC_INIT(2) ACC_INIT(3) ACC_INIT(4) ACC_INIT(5)
    if (npf) {
        for (int64_t k = k0; k < k1; ++k) {
            const __m256 b = _mm256_broadcast_ss(x + k);
            for (int i = 0; i < npf; ++i) _mm_prefetch((const char *)(pf[i] + k * PANEL), PF_HINT);
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

/* Two rows over k in [k0, k1) of a full group, three panels at a time: 12 accumulators
 * (2 rows x 3 panels x 2 halves), each weight vector loaded once and used by both rows,
 * so a k costs 6 weight loads and 2 broadcasts for 12 FMAs (one row alone: 12 loads and a
 * broadcast for 12 FMAs; the loads, not the FMA units, were the limit). Every output is
 * still one FMA chain over increasing k: bitwise what group_row computes. */
#define PAIR_INIT(r, j)                                                                  \
    __m256 r##lo##j, r##hi##j;                                                           \
    if (first) {                                                                         \
        r##lo##j = _mm256_setzero_ps();                                                  \
        r##hi##j = _mm256_setzero_ps();                                                  \
    } else {                                                                             \
        r##lo##j = _mm256_loadu_ps(a##r + (j) * PANEL);                                  \
        r##hi##j = _mm256_loadu_ps(a##r + (j) * PANEL + 8);                              \
    }
#define PAIR_FMA(j)                                                                      \
    {                                                                                    \
        __m256 wl = _mm256_loadu_ps(q##j + k * PANEL);                                   \
        __asm__("" : "+x"(wl)); /* keep it in a register: no second load folded into an FMA */ \
        r0lo##j = _mm256_fmadd_ps(b0, wl, r0lo##j);                                      \
        r1lo##j = _mm256_fmadd_ps(b1, wl, r1lo##j);                                      \
        __m256 wh = _mm256_loadu_ps(q##j + k * PANEL + 8);                               \
        __asm__("" : "+x"(wh));                                                          \
        r0hi##j = _mm256_fmadd_ps(b0, wh, r0hi##j);                                      \
        r1hi##j = _mm256_fmadd_ps(b1, wh, r1hi##j);                                      \
    }
#define PAIR_STORE(r, j)                                                                 \
    _mm256_storeu_ps(a##r + (j) * PANEL, r##lo##j);                                      \
    _mm256_storeu_ps(a##r + (j) * PANEL + 8, r##hi##j);

__attribute__((target("avx2,fma"))) static void group_rows2(
    const float *x0, const float *x1, const float *panel, int64_t stride, int64_t k0,
    int64_t k1, float *acc0, float *acc1, int first, const float *const *pf, int npf) {
    for (int half = 0; half < 2; ++half) {
        const float *q0 = panel + (int64_t)(3 * half) * stride, *q1 = q0 + stride, *q2 = q1 + stride;
        float *ar0 = acc0 + 3 * half * PANEL, *ar1 = acc1 + 3 * half * PANEL;
        PAIR_INIT(r0, 0) PAIR_INIT(r0, 1) PAIR_INIT(r0, 2)
        PAIR_INIT(r1, 0) PAIR_INIT(r1, 1) PAIR_INIT(r1, 2)
        if (npf && half == 0) { /* the prefetches go with the first three panels */
            for (int64_t k = k0; k < k1; ++k) {
                const __m256 b0 = _mm256_broadcast_ss(x0 + k), b1 = _mm256_broadcast_ss(x1 + k);
                for (int i = 0; i < npf; ++i) _mm_prefetch((const char *)(pf[i] + k * PANEL), PF_HINT);
                PAIR_FMA(0) PAIR_FMA(1) PAIR_FMA(2)
            }
        } else {
            for (int64_t k = k0; k < k1; ++k) {
                const __m256 b0 = _mm256_broadcast_ss(x0 + k), b1 = _mm256_broadcast_ss(x1 + k);
                PAIR_FMA(0) PAIR_FMA(1) PAIR_FMA(2)
            }
        }
        PAIR_STORE(r0, 0) PAIR_STORE(r0, 1) PAIR_STORE(r0, 2)
        PAIR_STORE(r1, 0) PAIR_STORE(r1, 1) PAIR_STORE(r1, 2)
    }
}

/* One block of k, [k0, k1), of `rows` rows (x: the first, rows ldx apart) over a group of
 * `count` (<= GROUP) panels; acc[r]: row r's running values (started when k0 == 0). */
typedef void (*block_fn)(const float *x, int64_t rows, int64_t ldx, const float *panel, int64_t stride,
                         int64_t count, int64_t K, int64_t k0, int64_t k1, float (*acc)[GROUP * PANEL]);

__attribute__((target("avx2,fma"))) static void avx2_block(
    const float *x, int64_t rows, int64_t ldx, const float *panel, int64_t stride, int64_t count,
    int64_t K, int64_t k0, int64_t k1, float (*acc)[GROUP * PANEL]) {
    if (count == GROUP && rows > 1) {
        /* The first row alone (it streams the block from memory: six streams at once),
         * then the others in pairs, an odd last row alone. The passes after the first
         * share out the prefetch of the block PF_BLOCKS ahead, panel by panel, so that
         * memory stays busy while they compute. */
        const int64_t kp = k0 + PF_BLOCKS * K_BLOCK;
        const int later = (int)(rows / 2); /* passes after the first */
        const float *pf[GROUP];
        int pass = 0;
        group_row(x, panel, stride, k0, k1, acc[0], k0 == 0, pf, 0);
        int64_t r = 1;
        while (r < rows) {
            int npf = 0;
            if (kp < K) {
                const int j0 = pass * GROUP / later, j1 = (pass + 1) * GROUP / later;
                for (int j = j0; j < j1; ++j) pf[npf++] = panel + j * stride + (kp - k0) * PANEL;
            }
            const float *xr = x + r * ldx;
            if (r + 1 < rows) {
                group_rows2(xr, xr + ldx, panel, stride, k0, k1, acc[r], acc[r + 1], k0 == 0, pf, npf);
                r += 2;
            } else {
                group_row(xr, panel, stride, k0, k1, acc[r], k0 == 0, pf, npf);
                r += 1;
            }
            ++pass;
        }
        return;
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * ldx;
        if (count == GROUP) {
            group_row(xr, panel, stride, k0, k1, acc[r], k0 == 0, 0, 0);
        } else {
            for (int64_t j = 0; j < count; ++j)
                panel_row(xr, panel + j * stride, k0, k1, acc[r] + j * PANEL, k0 == 0);
        }
    }
}

/* ---- the same GEMM on AVX-512 ----------------------------------------------------
 * One panel (16 columns) is exactly one 512-bit vector, so these kernels keep one
 * accumulator per (row, panel) and compute, lane by lane, the same single FMA chain over
 * increasing k as the AVX2 kernels above: bitwise the same outputs (an FMA rounds once,
 * whatever the vector width), with twice the multiply-adds per instruction and 32
 * registers. Up to five rows run together over a group of six panels (30 accumulators;
 * per k six weight vectors loaded once for all of them). Schedule per block of k: a
 * call of up to five rows (a verify of gamma <= 4) streams the block from memory in one
 * pass with all of them; a longer one streams it with its first 1-4 rows, then the
 * others four at a time re-read it from L1 and share out the prefetch of the next block
 * (the AVX2 kernel's scheme).
 * Bitwise the AVX2 kernel's results, faster the more rows a call has (a prefill most;
 * docs/benchmarks/README.md gives the figures). Used when the CPU has AVX-512F
 * and bs_panel_set_isa() allowed it (the Python loader does, unless
 * BANDITSPEC_PANEL_ISA=avx2). */
static int use_avx512 = 0;

int bs_panel_avx512_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* want: 512 for AVX-512 where the CPU has it, anything else for AVX2. Returns the width
 * now in use (512 or 256). Process-wide; call it before any GEMM runs. */
int bs_panel_set_isa(int want) {
    use_avx512 = (want == 512 && bs_panel_avx512_ok()) ? 1 : 0;
    return use_avx512 ? 512 : 256;
}

int bs_panel_isa(void) { return use_avx512 ? 512 : 256; }

/* One row over k in [k0, k1) of `count` (< GROUP) panels starting at `panel`, panel by panel. */
__attribute__((target("avx512f"))) static void z_row(
    const float *x, const float *panel, int64_t stride, int64_t count, int64_t k0, int64_t k1,
    float *acc, int first) {
    for (int64_t j = 0; j < count; ++j) {
        const float *p = panel + j * stride;
        __m512 z = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + j * PANEL);
        for (int64_t k = k0; k < k1; ++k) z = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), _mm512_loadu_ps(p + k * PANEL), z);
        _mm512_storeu_ps(acc + j * PANEL, z);
    }
}

/* n rows (x, x + ldx, ...; running values acc, acc + GROUP * PANEL, ...), n = 1..5 known
 * at the call (always inlined: the accumulators stay in registers), over k in [k0, k1)
 * of a full group: up to 30 accumulators, each weight vector loaded once for the n rows.
 * As the streaming pass (pf = NULL) it reads the block from memory with six streams at
 * once; as a later pass it re-reads it from L1 and prefetches its share of the next one. */
__attribute__((target("avx512f"), always_inline)) static inline void z_rows(
    const int n, const float *x, int64_t ldx, const float *panel, int64_t stride, int64_t k0,
    int64_t k1, float *acc, int first, const float *const *pf, int npf) {
    __m512 z[5][GROUP];
    const float *p[GROUP];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < GROUP; ++j) p[j] = panel + j * stride;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < n; ++r)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < GROUP; ++j)
            z[r][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * GROUP * PANEL + j * PANEL);
    for (int64_t k = k0; k < k1; ++k) {
        __m512 b[5];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < n; ++r) b[r] = _mm512_set1_ps(x[r * ldx + k]);
        _Pragma("GCC unroll 8")
        for (int i = 0; i < npf; ++i) _mm_prefetch((const char *)(pf[i] + k * PANEL), PF_HINT);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < GROUP; ++j) {
            const __m512 w = _mm512_loadu_ps(p[j] + k * PANEL);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < n; ++r) z[r][j] = _mm512_fmadd_ps(b[r], w, z[r][j]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < n; ++r)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < GROUP; ++j) _mm512_storeu_ps(acc + r * GROUP * PANEL + j * PANEL, z[r][j]);
}

/* z_rows for n = 1..5 (n outside: not called). */
__attribute__((target("avx512f"))) static void z_rows_n(
    int n, const float *x, int64_t ldx, const float *panel, int64_t stride, int64_t k0,
    int64_t k1, float *acc, int first, const float *const *pf, int npf) {
    switch (n) {
    case 1: z_rows(1, x, ldx, panel, stride, k0, k1, acc, first, pf, npf); break;
    case 2: z_rows(2, x, ldx, panel, stride, k0, k1, acc, first, pf, npf); break;
    case 3: z_rows(3, x, ldx, panel, stride, k0, k1, acc, first, pf, npf); break;
    case 5: z_rows(5, x, ldx, panel, stride, k0, k1, acc, first, pf, npf); break;
    default: z_rows(4, x, ldx, panel, stride, k0, k1, acc, first, pf, npf); break;
    }
}

/* The block on AVX-512 (avx2_block's job): up to five rows stream the block from memory together; more
 * stream it with their first 1-4 rows, then the other rows four at a time re-read it
 * from L1 and share out the prefetch of the next block. A partial group (fewer than
 * GROUP panels, at the end) goes row by row, panel by panel. */
__attribute__((target("avx512f"))) static void avx512_block(
    const float *x, int64_t rows, int64_t ldx, const float *panel, int64_t stride, int64_t count,
    int64_t K, int64_t k0, int64_t k1, float (*acc)[GROUP * PANEL]) {
    if (count != GROUP) {
        for (int64_t r = 0; r < rows; ++r) z_row(x + r * ldx, panel, stride, count, k0, k1, acc[r], k0 == 0);
        return;
    }
    /* up to five rows (a verify of gamma <= 4): one streaming pass with all of them (no
     * software prefetch: it slowed the hardware's); more: the first 1-4 rows stream,
     * the rest follow in whole fours (a last pass of one or two rows was slower than
     * AVX2 at 6 rows) */
    const int64_t lead = rows <= 5 ? rows : (rows - 1) % 4 + 1;
    const int64_t later = (rows - lead + 3) / 4; /* passes after the streaming one */
    const int64_t kp = k0 + PF_BLOCKS * K_BLOCK;
    const float *pf[GROUP];
    z_rows_n((int)lead, x, ldx, panel, stride, k0, k1, acc[0], k0 == 0, pf, 0);
    int64_t pass = 0;
    for (int64_t r = lead; r < rows; r += 4, ++pass) {
        int npf = 0;
        if (kp < K) {
            const int64_t j0 = pass * GROUP / later, j1 = (pass + 1) * GROUP / later;
            for (int64_t j = j0; j < j1; ++j) pf[npf++] = panel + j * stride + (kp - k0) * PANEL;
        }
        const int n = (int)((rows - r) < 4 ? (rows - r) : 4);
        z_rows_n(n, x + r * ldx, ldx, panel, stride, k0, k1, acc[r], k0 == 0, pf, npf);
    }
}

#define ROWS_PER_PASS 32 /* rows whose running values are kept per pass (32 x 384 B on the stack) */

/* Panels [p_begin, p_end) (at most GROUP) for every row: ROWS_PER_PASS rows at a time,
 * block by block of K_BLOCK values of k, each block computed by `block`. */
static void one_group(
    block_fn block, const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed,
    int64_t stride, int64_t N, float *y, int64_t ldy, int64_t p_begin, int64_t p_end) {
    float acc[ROWS_PER_PASS][GROUP * PANEL];
    const int64_t count = p_end - p_begin;
    const float *panel = packed + p_begin * stride;
    for (int64_t m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        const int64_t rows = (M - m0) < ROWS_PER_PASS ? (M - m0) : ROWS_PER_PASS;
        for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK) {
            const int64_t k1 = (k0 + K_BLOCK) < K ? (k0 + K_BLOCK) : K;
            block(x + m0 * ldx, rows, ldx, panel, stride, count, K, k0, k1, acc);
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
        one_group(use_avx512 ? avx512_block : avx2_block, x, M, K, ldx, packed, stride, N, y, ldy, p_begin, p_end);
    }
}

