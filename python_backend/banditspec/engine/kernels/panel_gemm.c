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

/* ---- attention ------------------------------------------------------------------
 * out[b, t, h, :] = softmax_j(scale * q[b, h, t, :] . k[b, h / G, j, :]) v[b, h / G, j, :]
 * over keys j in [lo[b T + t], hi[b T + t]), G = H / KVH (grouped-query attention).
 *
 * Exactness: every reduction runs in one fixed order that depends only on the key range,
 * never on the rows or heads computed beside it:
 * - each dot product is 8 FMA lanes over d (d = 0..D-1 in steps of 8), the lanes then
 *   summed in order 0..7 (for 8 keys at once after a transpose: the same adds per key);
 * - the softmax takes the max (exact in any order), then bs_exp(s - max) per key (a
 *   fixed polynomial, lane-independent), summed in 8 partial sums over (j - lo) mod 8,
 *   the partials then added in order 0..7;
 * - the output is one FMA chain per element over increasing j, divided by the sum.
 * So a query row's result is bitwise the same however many rows the call carries and
 * wherever its keys sit in the (left-padded) cache: a verify step, one-token decoding and
 * a batched step compute the same values.
 *
 * Schedule: per (sequence, kv head, block of ROW_BLOCK rows), keys in chunks of
 * KEY_CHUNK (K and V chunks stay in L1 while every row of the block uses them); the G
 * query heads that share a kv head run together, three at a time (12 accumulators: 3
 * heads x 4 keys for the scores, 3 heads x 4 output vectors for the weighted sum), so a
 * key or value vector is loaded once for three heads.
 *
 * q: element (b, h, t, d) at q[b qsb + h qsh + t qst + d]; k, v: element (b, g, j, d) at
 * k[b kvsb + g kvsh + j D + d] (rows of D contiguous floats); out: [B, T, H, D]
 * contiguous; D a multiple of 8.
 */
#include <math.h>
#include <stdlib.h>

#define ROW_BLOCK 16
#define KEY_CHUNK 32

/* e^x for x <= 0 (x - max of a softmax), lane by lane: x = n ln2 + r, |r| <= ln2 / 2,
 * e^r by a degree-6 polynomial (relative error ~2e-7), scaled by 2^n; 0 below -87. */
__attribute__((target("avx2,fma"))) static inline __m256 bs_exp(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.3981999507e-3f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* out[i] = lanes 0..7 of v[i] added in order (v: 8 vectors), for 8 vectors at once. */
__attribute__((target("avx2,fma"))) static inline __m256 hsum8(const __m256 *v) {
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    /* lane l of every vector: l = 0, 1, 2, 3 from the low halves, 4..7 from the high */
    __m256 sum = _mm256_permute2f128_ps(s0, s4, 0x20);
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(s1, s5, 0x20));
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(s2, s6, 0x20));
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(s3, s7, 0x20));
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(s0, s4, 0x31));
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(s1, s5, 0x31));
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(s2, s6, 0x31));
    return _mm256_add_ps(sum, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* Scores of three queries q[0..2] against keys [j0, j1): sc[i][j] = scale * (q[i] . key j). */
__attribute__((target("avx2,fma"))) static void scores3(
    const float *const *q, const float *keys, int64_t j0, int64_t j1, int64_t D, float scale,
    float *const *sc) {
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
        const float *kr = keys + j * D;
        __m256 a[12];
        for (int i = 0; i < 12; ++i) a[i] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            const __m256 q0 = _mm256_loadu_ps(q[0] + d), q1 = _mm256_loadu_ps(q[1] + d), q2 = _mm256_loadu_ps(q[2] + d);
            for (int kk = 0; kk < 4; ++kk) {
                __m256 kv = _mm256_loadu_ps(kr + kk * D + d);
                __asm__("" : "+x"(kv));
                a[kk] = _mm256_fmadd_ps(q0, kv, a[kk]);
                a[4 + kk] = _mm256_fmadd_ps(q1, kv, a[4 + kk]);
                a[8 + kk] = _mm256_fmadd_ps(q2, kv, a[8 + kk]);
            }
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_mul_ps(hsum8(a), vscale)); /* q0 and q1, keys j..j+3 */
        for (int kk = 0; kk < 4; ++kk) { sc[0][j + kk] = lanes[kk]; sc[1][j + kk] = lanes[4 + kk]; }
        const __m256 rest[8] = {a[8], a[9], a[10], a[11], a[8], a[9], a[10], a[11]};
        _mm256_storeu_ps(lanes, _mm256_mul_ps(hsum8(rest), vscale));
        for (int kk = 0; kk < 4; ++kk) sc[2][j + kk] = lanes[kk];
    }
    for (; j < j1; ++j) { /* the same sums, one key at a time */
        const float *kr = keys + j * D;
        __m256 a[8];
        for (int i = 0; i < 3; ++i) a[i] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            const __m256 kv = _mm256_loadu_ps(kr + d);
            for (int i = 0; i < 3; ++i) a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q[i] + d), kv, a[i]);
        }
        for (int i = 3; i < 8; ++i) a[i] = a[0];
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_mul_ps(hsum8(a), vscale));
        for (int i = 0; i < 3; ++i) sc[i][j] = lanes[i];
    }
}

/* Softmax weights in place over [j0, j1): w[j] = bs_exp(w[j] - max); returns their sum. */
__attribute__((target("avx2,fma"))) static float softmax_weights(float *w, int64_t j0, int64_t j1) {
    float m = -INFINITY;
    for (int64_t j = j0; j < j1; ++j)
        if (w[j] > m) m = w[j];
    const __m256 vm = _mm256_set1_ps(m);
    __m256 partial = _mm256_setzero_ps(); /* lane l: keys with (j - j0) mod 8 == l */
    int64_t j = j0;
    for (; j + 8 <= j1; j += 8) {
        const __m256 e = bs_exp(_mm256_sub_ps(_mm256_loadu_ps(w + j), vm));
        _mm256_storeu_ps(w + j, e);
        partial = _mm256_add_ps(partial, e);
    }
    if (j < j1) { /* the tail through the same function; missing lanes add 0 */
        float tail[8] = {0};
        const int64_t n = j1 - j;
        for (int64_t i = 0; i < n; ++i) tail[i] = w[j + i];
        __m256 e = bs_exp(_mm256_sub_ps(_mm256_loadu_ps(tail), vm));
        _mm256_storeu_ps(tail, e);
        for (int64_t i = 0; i < n; ++i) w[j + i] = tail[i];
        for (int64_t i = n; i < 8; ++i) tail[i] = 0.0f;
        partial = _mm256_add_ps(partial, _mm256_loadu_ps(tail));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, partial);
    float sum = lanes[0];
    for (int i = 1; i < 8; ++i) sum += lanes[i];
    return sum;
}

/* acc[i][d0 .. d0 + 32) += sum_j w[i][j] values[j, d0 .. d0 + 32) over [j0, j1) for three
 * queries: one FMA chain per element in increasing j (named accumulators: an array here
 * made the compiler store all twelve on every key). */
#define W_INIT(i, v) __m256 a##i##v = _mm256_loadu_ps(acc[i] + d0 + 8 * (v));
#define W_FMA(v)                                                                         \
    {                                                                                    \
        __m256 vv = _mm256_loadu_ps(vr + 8 * (v));                                       \
        __asm__("" : "+x"(vv));                                                          \
        a0##v = _mm256_fmadd_ps(w0, vv, a0##v);                                          \
        a1##v = _mm256_fmadd_ps(w1, vv, a1##v);                                          \
        a2##v = _mm256_fmadd_ps(w2, vv, a2##v);                                          \
    }
#define W_STORE(i, v) _mm256_storeu_ps(acc[i] + d0 + 8 * (v), a##i##v);
__attribute__((target("avx2,fma"))) static void weighted3_32(
    const float *const *w, const float *values, int64_t j0, int64_t j1, int64_t D, int64_t d0,
    float *const *acc) {
    W_INIT(0, 0) W_INIT(0, 1) W_INIT(0, 2) W_INIT(0, 3)
    W_INIT(1, 0) W_INIT(1, 1) W_INIT(1, 2) W_INIT(1, 3)
    W_INIT(2, 0) W_INIT(2, 1) W_INIT(2, 2) W_INIT(2, 3)
    const float *w0p = w[0], *w1p = w[1], *w2p = w[2];
    for (int64_t j = j0; j < j1; ++j) {
        const float *vr = values + j * D + d0;
        const __m256 w0 = _mm256_broadcast_ss(w0p + j), w1 = _mm256_broadcast_ss(w1p + j), w2 = _mm256_broadcast_ss(w2p + j);
        W_FMA(0) W_FMA(1) W_FMA(2) W_FMA(3)
    }
    W_STORE(0, 0) W_STORE(0, 1) W_STORE(0, 2) W_STORE(0, 3)
    W_STORE(1, 0) W_STORE(1, 1) W_STORE(1, 2) W_STORE(1, 3)
    W_STORE(2, 0) W_STORE(2, 1) W_STORE(2, 2) W_STORE(2, 3)
}

/* The same over all of D (a multiple of 8): 32 columns at a time, then 8 at a time. */
__attribute__((target("avx2,fma"))) static void weighted3(
    const float *const *w, const float *values, int64_t j0, int64_t j1, int64_t D, float *const *acc) {
    int64_t d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) weighted3_32(w, values, j0, j1, D, d0, acc);
    for (; d0 < D; d0 += 8) {
        __m256 a0 = _mm256_loadu_ps(acc[0] + d0), a1 = _mm256_loadu_ps(acc[1] + d0), a2 = _mm256_loadu_ps(acc[2] + d0);
        for (int64_t j = j0; j < j1; ++j) {
            const __m256 vv = _mm256_loadu_ps(values + j * D + d0);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[0] + j), vv, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[1] + j), vv, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w[2] + j), vv, a2);
        }
        _mm256_storeu_ps(acc[0] + d0, a0);
        _mm256_storeu_ps(acc[1] + d0, a1);
        _mm256_storeu_ps(acc[2] + d0, a2);
    }
}

/* The keys of range [lo, hi) inside the chunk [c0, c0 + KEY_CHUNK): [*a, *z); 0 if none. */
static inline int chunk_keys(int64_t lo, int64_t hi, int64_t c0, int64_t *a, int64_t *z) {
    *a = lo > c0 ? lo : c0;
    *z = hi < c0 + KEY_CHUNK ? hi : c0 + KEY_CHUNK;
    return *a < *z;
}

__attribute__((target("avx2,fma"))) void bs_attention(
    const float *q, int64_t qsb, int64_t qsh, int64_t qst, const float *k, const float *v,
    int64_t kvsb, int64_t kvsh, const int64_t *lo, const int64_t *hi, float *out, int64_t B,
    int64_t H, int64_t KVH, int64_t T, int64_t D, float scale, int threads) {
    const int64_t G = H / KVH;
    const int64_t G3 = (G + 2) / 3 * 3; /* heads padded to whole triples (extras redo the last) */
    const int64_t row_blocks = (T + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t jobs = B * KVH * row_blocks;
    int64_t L = 1; /* the longest key range */
    for (int64_t i = 0; i < B * T; ++i)
        if (hi[i] > L) L = hi[i];
#pragma omp parallel num_threads(threads) if (threads > 1 && T >= PARALLEL_MIN_ROWS)
    {
        /* per row of a block and head (triple-padded): scores/weights over keys [0, L), and
         * the output's running values (D floats) */
        float *w = (float *)malloc((size_t)(ROW_BLOCK * G3 * L) * sizeof(float));
        float *acc = (float *)malloc((size_t)(ROW_BLOCK * G3 * D) * sizeof(float));
        float *sums = (float *)malloc((size_t)(ROW_BLOCK * G3) * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t job = 0; job < jobs; ++job) {
            const int64_t b = job / (KVH * row_blocks), g = (job / row_blocks) % KVH;
            const int64_t t0 = (job % row_blocks) * ROW_BLOCK;
            const int64_t rows = (T - t0) < ROW_BLOCK ? (T - t0) : ROW_BLOCK;
            const float *kb = k + b * kvsb + g * kvsh, *vb = v + b * kvsb + g * kvsh;
            int64_t jlo = INT64_MAX, jhi = 0;
            for (int64_t r = 0; r < rows; ++r) {
                if (lo[b * T + t0 + r] < jlo) jlo = lo[b * T + t0 + r];
                if (hi[b * T + t0 + r] > jhi) jhi = hi[b * T + t0 + r];
            }
            /* scores, keys chunk by chunk, every row and head triple of the block per chunk */
            for (int64_t c0 = jlo; c0 < jhi; c0 += KEY_CHUNK) {
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t t = t0 + r;
                    int64_t a, z;
                    if (!chunk_keys(lo[b * T + t], hi[b * T + t], c0, &a, &z)) continue;
                    for (int64_t h3 = 0; h3 < G3; h3 += 3) {
                        const float *qs[3];
                        float *sc[3];
                        for (int i = 0; i < 3; ++i) {
                            const int64_t hh = (h3 + i) < G ? (h3 + i) : (G - 1);
                            qs[i] = q + b * qsb + (g * G + hh) * qsh + t * qst;
                            sc[i] = w + (r * G3 + h3 + i) * L;
                        }
                        scores3(qs, kb, a, z, D, scale, sc);
                    }
                }
            }
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t t = t0 + r;
                for (int64_t h = 0; h < G3; ++h) {
                    sums[r * G3 + h] = softmax_weights(w + (r * G3 + h) * L, lo[b * T + t], hi[b * T + t]);
                    memset(acc + (r * G3 + h) * D, 0, (size_t)D * sizeof(float));
                }
            }
            /* weighted sums, chunk by chunk (each element's chain runs on in increasing j) */
            for (int64_t c0 = jlo; c0 < jhi; c0 += KEY_CHUNK) {
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t t = t0 + r;
                    int64_t a, z;
                    if (!chunk_keys(lo[b * T + t], hi[b * T + t], c0, &a, &z)) continue;
                    for (int64_t h3 = 0; h3 < G3; h3 += 3) {
                        const float *ws[3];
                        float *as[3];
                        for (int i = 0; i < 3; ++i) {
                            ws[i] = w + (r * G3 + h3 + i) * L;
                            as[i] = acc + (r * G3 + h3 + i) * D;
                        }
                        weighted3(ws, vb, a, z, D, as);
                    }
                }
            }
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t t = t0 + r;
                for (int64_t h = 0; h < G; ++h) {
                    const float *a = acc + (r * G3 + h) * D;
                    float *o = out + ((b * T + t) * H + g * G + h) * D;
                    const __m256 sum = _mm256_set1_ps(sums[r * G3 + h]);
                    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(a + d), sum));
                }
            }
        }
        free(w);
        free(acc);
        free(sums);
    }
}

/* ---------------------------------------------------------------------------------------
 * Int8-weight small-M GEMM for drafting heads (the Eagle head's linears and LM-head rows):
 * y[M, N] = (x[M, K] @ Wq[N, K]^T) * scale[N], W quantized per output row to int8, x fp32
 * (not quantized). NOT the exact kernel above: a draft head's numerics only change which
 * tokens it proposes, and drafts are verified.
 *
 * Why: a head call comes right after a target forward has evicted the caches, and torch's
 * dynamic int8 linear (fbgemm) then costs ~0.5 ms per layer here whatever its size (0.33 MB
 * or 1.8 MB of weights): packed-weight metadata, activation quantization and code all cold.
 * This streams each weight byte once per call, in I8_GROUP panels of 16 int8 columns
 * (packed[p][k][j] = Wq[16 p + j][k], zero past N; N padded to whole groups), a block of
 * I8_KB values of k at a time: the block is widened to fp32 in L1 once, then every row
 * multiplies it (8 accumulators a row). Rows: at most I8_MAXM a call (callers fall back above).
 */
#define I8_GROUP 4
#define I8_KB 64
#define I8_MAXM 16

int bs_i8_max_rows(void) { return I8_MAXM; }
int bs_i8_group_columns(void) { return I8_GROUP * PANEL; }

/* Bytes from one int8 panel's start to the next (K * 16, plus one cache line when that is
 * a multiple of 4 KiB, so that a group's streams do not share L1 sets). */
int64_t bs_i8_stride(int64_t K) {
    int64_t stride = K * PANEL;
    if (stride % 4096 == 0) stride += 64;
    return stride;
}

__attribute__((target("avx2,fma"))) void bs_i8_gemm(
    const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed, int64_t stride,
    const float *scale, int64_t N, float *y, int64_t ldy) {
    float acc[I8_MAXM * I8_GROUP * PANEL] __attribute__((aligned(32)));
    float deq[I8_GROUP * I8_KB * PANEL] __attribute__((aligned(32))); /* 16 KiB */
    if (M <= 0 || M > I8_MAXM) return;
    const int64_t groups = (N + I8_GROUP * PANEL - 1) / (I8_GROUP * PANEL);
    for (int64_t g = 0; g < groups; ++g) {
        const int8_t *panels = packed + g * I8_GROUP * stride;
        memset(acc, 0, (size_t)M * I8_GROUP * PANEL * sizeof(float));
        for (int64_t k0 = 0; k0 < K; k0 += I8_KB) {
            const int64_t kn = K - k0 < I8_KB ? K - k0 : I8_KB;
            for (int j = 0; j < I8_GROUP; ++j) {
                const int8_t *src = panels + j * stride + k0 * PANEL;
                float *dst = deq + j * I8_KB * PANEL;
                for (int64_t k = 0; k < kn; ++k) {
                    if ((k & 3) == 0) _mm_prefetch((const char *)(src + (k + I8_KB) * PANEL), _MM_HINT_T0);
                    const __m128i b = _mm_loadu_si128((const __m128i *)(src + k * PANEL));
                    _mm256_store_ps(dst + k * PANEL, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
                    _mm256_store_ps(dst + k * PANEL + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
                }
            }
            for (int64_t m = 0; m < M; ++m) {
                const float *xr = x + m * ldx + k0;
                float *a = acc + m * I8_GROUP * PANEL;
                __m256 a0 = _mm256_load_ps(a), a1 = _mm256_load_ps(a + 8), a2 = _mm256_load_ps(a + 16),
                       a3 = _mm256_load_ps(a + 24), a4 = _mm256_load_ps(a + 32), a5 = _mm256_load_ps(a + 40),
                       a6 = _mm256_load_ps(a + 48), a7 = _mm256_load_ps(a + 56);
                const float *d0 = deq, *d1 = deq + I8_KB * PANEL, *d2 = deq + 2 * I8_KB * PANEL,
                            *d3 = deq + 3 * I8_KB * PANEL;
                for (int64_t k = 0; k < kn; ++k) {
                    const __m256 b = _mm256_broadcast_ss(xr + k);
                    a0 = _mm256_fmadd_ps(b, _mm256_load_ps(d0 + k * PANEL), a0);
                    a1 = _mm256_fmadd_ps(b, _mm256_load_ps(d0 + k * PANEL + 8), a1);
                    a2 = _mm256_fmadd_ps(b, _mm256_load_ps(d1 + k * PANEL), a2);
                    a3 = _mm256_fmadd_ps(b, _mm256_load_ps(d1 + k * PANEL + 8), a3);
                    a4 = _mm256_fmadd_ps(b, _mm256_load_ps(d2 + k * PANEL), a4);
                    a5 = _mm256_fmadd_ps(b, _mm256_load_ps(d2 + k * PANEL + 8), a5);
                    a6 = _mm256_fmadd_ps(b, _mm256_load_ps(d3 + k * PANEL), a6);
                    a7 = _mm256_fmadd_ps(b, _mm256_load_ps(d3 + k * PANEL + 8), a7);
                }
                _mm256_store_ps(a, a0); _mm256_store_ps(a + 8, a1); _mm256_store_ps(a + 16, a2);
                _mm256_store_ps(a + 24, a3); _mm256_store_ps(a + 32, a4); _mm256_store_ps(a + 40, a5);
                _mm256_store_ps(a + 48, a6); _mm256_store_ps(a + 56, a7);
            }
        }
        const int64_t n0 = g * I8_GROUP * PANEL;
        const int64_t width = N - n0 < I8_GROUP * PANEL ? N - n0 : I8_GROUP * PANEL;
        for (int64_t m = 0; m < M; ++m)
            for (int64_t c = 0; c < width; ++c) y[m * ldy + n0 + c] = acc[m * I8_GROUP * PANEL + c] * scale[n0 + c];
    }
}

/* Any number of rows: bs_i8_gemm over blocks of I8_MAXM rows. */
static void i8_gemm_rows(const float *x, int64_t M, int64_t K, const int8_t *packed, int64_t stride,
                         const float *scale, int64_t N, float *y) {
    for (int64_t m = 0; m < M; m += I8_MAXM)
        bs_i8_gemm(x + m * K, M - m < I8_MAXM ? M - m : I8_MAXM, K, K, packed, stride, scale, N, y + m * N, N);
}

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of n. */
static void rms_norm_rows(const float *x, int64_t rows, int64_t n, int64_t ldx, const float *w, float eps,
                          float *y, int64_t ldy) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * ldx;
        float *yr = y + r * ldy;
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
    }
}

/* HF Llama's half rotation of one head vector x[D] at a position (cos/sin rows of D). */
static void rope_row(const float *x, const float *cos_r, const float *sin_r, int64_t D, float *y) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; ++i) y[i] = x[i] * cos_r[i] - x[i + half] * sin_r[i];
    for (int64_t i = half; i < D; ++i) y[i] = x[i] * cos_r[i] + x[i - half] * sin_r[i];
}

/* One incremental step of an Eagle head (banditspec/eagle/fast_step.py, same math) over T new
 * pairs, int8 weights, in one call: a call after a target forward otherwise paid the caches'
 * misses op by op (~25 torch ops). emb, feat: [T, H]; norms: embed, feature, post-attention,
 * out [H]; w/strides/scales: fc, qkv, o (NH D -> H), gate_up (H -> 2 I), down (I -> H), packed
 * by bs_i8 layout; cos, sin: [T, D] for positions past .. past + T - 1; kc, vc: the session's
 * cache [NKV, capacity, D] (rows past .. past + T - 1 are written); out: [T, H].
 *   EAGLE-1 (eagle3 = 0): u = fc([norm(emb); norm(feat)]) + fc_bias (2H -> H), qkv from u
 *     (H -> QKV), the attention's residual over u, out = out_norm(x).
 *   EAGLE-3 (eagle3 = 1): qkv straight from [norm(emb); norm(feat)] (2H -> QKV; w[0], fc_bias
 *     and norms[3] unread), the residual over feat (the head's hidden input), out = x.
 * Returns 0, or -1 when its scratch memory could not be allocated (nothing written then). */
__attribute__((target("avx2,fma"))) int bs_eagle_step(
    int64_t T, int64_t H, int64_t NH, int64_t NKV, int64_t D, int64_t I, float eps, const float *emb,
    const float *feat, const float *const *norms, const int8_t *const *w, const int64_t *strides,
    const float *const *scales, const float *fc_bias, const float *cos, const float *sin, float *kc, float *vc,
    int64_t capacity, int64_t past, float *out, int64_t eagle3) {
    const int64_t QKV = (NH + 2 * NKV) * D;
    float *xin = malloc(sizeof(float) * T * 2 * H), *u = malloc(sizeof(float) * T * H),
          *qkv = malloc(sizeof(float) * T * QKV), *q = malloc(sizeof(float) * NH * T * D),
          *attn = malloc(sizeof(float) * T * NH * D), *x = malloc(sizeof(float) * T * H),
          *hn = malloc(sizeof(float) * T * H), *gu = malloc(sizeof(float) * T * 2 * I),
          *act = malloc(sizeof(float) * T * I);
    int64_t *lo = malloc(sizeof(int64_t) * T), *hi = malloc(sizeof(int64_t) * T);
    int status = 0;
    if (!xin || !u || !qkv || !q || !attn || !x || !hn || !gu || !act || !lo || !hi) {
        status = -1;
        goto done;
    }
    rms_norm_rows(emb, T, H, H, norms[0], eps, xin, 2 * H);
    rms_norm_rows(feat, T, H, H, norms[1], eps, xin + H, 2 * H);
    const float *residual;
    if (eagle3) {
        i8_gemm_rows(xin, T, 2 * H, w[1], strides[1], scales[1], QKV, qkv);
        residual = feat;
    } else {
        i8_gemm_rows(xin, T, 2 * H, w[0], strides[0], scales[0], H, u);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < H; ++i) u[t * H + i] += fc_bias[i];
        i8_gemm_rows(u, T, H, w[1], strides[1], scales[1], QKV, qkv);
        residual = u;
    }
    for (int64_t t = 0; t < T; ++t) {
        const float *row = qkv + t * QKV, *c = cos + t * D, *s = sin + t * D;
        for (int64_t h = 0; h < NH; ++h) rope_row(row + h * D, c, s, D, q + (h * T + t) * D);
        for (int64_t g = 0; g < NKV; ++g) {
            rope_row(row + (NH + g) * D, c, s, D, kc + (g * capacity + past + t) * D);
            memcpy(vc + (g * capacity + past + t) * D, row + (NH + NKV + g) * D, sizeof(float) * D);
        }
        lo[t] = 0;
        hi[t] = past + t + 1;
    }
    bs_attention(q, NH * T * D, T * D, D, kc, vc, NKV * capacity * D, capacity * D, lo, hi, attn, 1, NH, NKV, T,
                 D, 1.0f / sqrtf((float)D), 1);
    i8_gemm_rows(attn, T, NH * D, w[2], strides[2], scales[2], H, x);
    for (int64_t i = 0; i < T * H; ++i) x[i] += residual[i];
    rms_norm_rows(x, T, H, H, norms[2], eps, hn, H);
    i8_gemm_rows(hn, T, H, w[3], strides[3], scales[3], 2 * I, gu);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < I; ++i) {
            const float g = gu[t * 2 * I + i];
            act[t * I + i] = g / (1.0f + expf(-g)) * gu[t * 2 * I + I + i];
        }
    i8_gemm_rows(act, T, I, w[4], strides[4], scales[4], H, hn);
    for (int64_t i = 0; i < T * H; ++i) x[i] += hn[i];
    if (eagle3)
        memcpy(out, x, sizeof(float) * T * H);
    else
        rms_norm_rows(x, T, H, H, norms[3], eps, out, H);
done:
    free(xin); free(u); free(qkv); free(q); free(attn); free(x); free(hn); free(gu); free(act); free(lo); free(hi);
    return status;
}

/* REST's datastore search (banditspec.drafters.rest_datastore): the suffix array `sa` of the
 * corpus `tokens` (n ids, each document ended by a separator larger than any id). Token
 * ids compare as unsigned 32-bit values, a suffix that ends first is the smaller (the
 * same order as the big-endian bytes the Python search compares). */
static int sa_compare(const int32_t *tokens, int64_t n, int64_t start, const int32_t *pattern, int64_t m) {
    for (int64_t i = 0; i < m; ++i) {
        if (start + i >= n) return -1;
        const uint32_t a = (uint32_t)tokens[start + i], b = (uint32_t)pattern[i];
        if (a != b) return a < b ? -1 : 1;
    }
    return 0;
}

/* [out[0], out[1]): the rows of sa whose suffix starts with pattern[0 .. m). */
void bs_sa_range(const int32_t *tokens, int64_t n, const int32_t *sa, const int32_t *pattern, int64_t m, int64_t *out) {
    int64_t lo = 0, hi = n;
    while (lo < hi) { /* first row whose suffix is >= pattern */
        const int64_t mid = lo + (hi - lo) / 2;
        if (sa_compare(tokens, n, sa[mid], pattern, m) < 0) lo = mid + 1; else hi = mid;
    }
    int64_t end = n, first = lo;
    while (first < end) { /* first row whose suffix is > pattern */
        const int64_t mid = first + (end - first) / 2;
        if (sa_compare(tokens, n, sa[mid], pattern, m) <= 0) first = mid + 1; else end = mid;
    }
    out[0] = lo;
    out[1] = first;
}

/* The longest suffix of context[0 .. len) of length min_m .. max_m (max_m <= len) that occurs in
 * the corpus: out = (m, lo, hi), m = 0 when none. A binary search over the length (a shorter
 * suffix of a present one is present), as RestDrafter.longest_match does in Python. */
void bs_sa_longest(const int32_t *tokens, int64_t n, const int32_t *sa, const int32_t *context, int64_t len,
                   int64_t min_m, int64_t max_m, int64_t *out) {
    int64_t lo_len = min_m - 1, hi_len = max_m < len ? max_m : len, range[2];
    out[0] = out[1] = out[2] = 0;
    while (lo_len < hi_len) {
        const int64_t mid = (lo_len + hi_len + 1) / 2;
        bs_sa_range(tokens, n, sa, context + (len - mid), mid, range);
        if (range[1] > range[0]) {
            lo_len = mid;
            out[0] = mid; out[1] = range[0]; out[2] = range[1];
        } else {
            hi_len = mid - 1;
        }
    }
}

/* REST's continuation (RestDrafter.continuation_python does the same in numpy): the most
 * frequent next token among the occurrences in suffix-array rows [lo, hi) of a match of
 * match_len tokens, then among the occurrences that continued with it, and so on, up to
 * max_len tokens; at most max_matches occurrences are read, evenly spaced as numpy's
 * linspace(lo, hi - 1, max_matches) truncated; ties go to the smallest token id; a group that
 * is the separator, or whose share of the remaining occurrences is below min_share, ends it;
 * one occurrence left: its document is copied up to the separator. Writes out[0 .. k),
 * returns k (-1: no memory). */
int64_t bs_sa_continuation(const int32_t *tokens, int64_t n, const int32_t *sa, int64_t lo, int64_t hi,
                           int64_t match_len, int64_t max_matches, double min_share, int32_t separator,
                           int64_t max_len, int32_t *out) {
    int64_t count = hi - lo, k = 0;
    if (count <= 0 || max_len <= 0) return 0;
    if (count > max_matches) count = max_matches;
    int64_t *positions = (int64_t *)malloc((size_t)count * sizeof(int64_t));
    if (!positions) return -1;
    if (hi - lo <= max_matches) {
        for (int64_t i = 0; i < count; i++) positions[i] = (int64_t)sa[lo + i] + match_len;
    } else {
        const double step = count > 1 ? (double)(hi - 1 - lo) / (double)(count - 1) : 0.0;
        for (int64_t i = 0; i < count; i++) {
            const double y = (double)i * step;  /* numpy: arange * step, then + start */
            const int64_t row = (count > 1 && i == count - 1) ? hi - 1 : (int64_t)(y + (double)lo);
            positions[i] = (int64_t)sa[row] + match_len;
        }
    }
    while (k < max_len && count > 0) {
        if (count == 1) {
            for (int64_t p = positions[0]; p < n && k < max_len && tokens[p] != separator; p++) out[k++] = tokens[p];
            break;
        }
        int64_t best_start = 0, best_size = 0, start = 0;
        while (start < count) {  /* runs of one next token (the rows are sorted by it) */
            const int32_t token = tokens[positions[start]];
            int64_t end = start + 1;
            while (end < count && tokens[positions[end]] == token) end++;
            const int64_t size = token == separator ? 0 : end - start;
            if (size > best_size) { best_size = size; best_start = start; }
            start = end;
        }
        if (best_size == 0 || (double)best_size < min_share * (double)count) break;
        out[k++] = tokens[positions[best_start]];
        for (int64_t i = 0; i < best_size; i++) positions[i] = positions[best_start + i] + 1;
        count = best_size;
    }
    free(positions);
    return k;
}
