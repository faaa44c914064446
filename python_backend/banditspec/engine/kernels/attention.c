/* Attention: out[b, t, h, :] = softmax_j(scale * q[b, h, t, :] . k[b, h / G, j, :]) v[b, h / G, j, :]
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
#include "common.h"

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

/* One job: kv head g of one sequence, query rows t = 0 .. rows - 1 of a block. qb: q of
 * that sequence's head 0, row 0 of the block (element (h, t, d) at qb[h qsh + t qst + d]);
 * kb, vb: that kv head's keys and values (rows of D floats); lo, hi: the block's rows' key
 * ranges; ob: out of the block's row 0 ([rows, H, D]); w, acc, sums: scratch for
 * ROW_BLOCK rows of G3 heads over L keys. */
__attribute__((target("avx2,fma"))) static void attend_block(
    const float *qb, int64_t qsh, int64_t qst, const float *kb, const float *vb, const int64_t *lo,
    const int64_t *hi, int64_t rows, int64_t g, int64_t G, int64_t G3, int64_t H, int64_t D, int64_t L,
    float scale, float *ob, float *w, float *acc, float *sums) {
    int64_t jlo = INT64_MAX, jhi = 0;
    for (int64_t r = 0; r < rows; ++r) {
        if (lo[r] < jlo) jlo = lo[r];
        if (hi[r] > jhi) jhi = hi[r];
    }
    /* scores, keys chunk by chunk, every row and head triple of the block per chunk */
    for (int64_t c0 = jlo; c0 < jhi; c0 += KEY_CHUNK) {
        for (int64_t r = 0; r < rows; ++r) {
            int64_t a, z;
            if (!chunk_keys(lo[r], hi[r], c0, &a, &z)) continue;
            for (int64_t h3 = 0; h3 < G3; h3 += 3) {
                const float *qs[3];
                float *sc[3];
                for (int i = 0; i < 3; ++i) {
                    const int64_t hh = (h3 + i) < G ? (h3 + i) : (G - 1);
                    qs[i] = qb + (g * G + hh) * qsh + r * qst;
                    sc[i] = w + (r * G3 + h3 + i) * L;
                }
                scores3(qs, kb, a, z, D, scale, sc);
            }
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < G3; ++h) {
            sums[r * G3 + h] = softmax_weights(w + (r * G3 + h) * L, lo[r], hi[r]);
            memset(acc + (r * G3 + h) * D, 0, (size_t)D * sizeof(float));
        }
    }
    /* weighted sums, chunk by chunk (each element's chain runs on in increasing j) */
    for (int64_t c0 = jlo; c0 < jhi; c0 += KEY_CHUNK) {
        for (int64_t r = 0; r < rows; ++r) {
            int64_t a, z;
            if (!chunk_keys(lo[r], hi[r], c0, &a, &z)) continue;
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
        for (int64_t h = 0; h < G; ++h) {
            const float *a = acc + (r * G3 + h) * D;
            float *o = ob + (r * H + g * G + h) * D;
            const __m256 sum = _mm256_set1_ps(sums[r * G3 + h]);
            for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(a + d), sum));
        }
    }
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
            attend_block(q + b * qsb + t0 * qst, qsh, qst, k + b * kvsb + g * kvsh, v + b * kvsb + g * kvsh,
                         lo + b * T + t0, hi + b * T + t0, rows, g, G, G3, H, D, L, scale,
                         out + (b * T + t0) * H * D, w, acc, sums);
        }
        free(w);
        free(acc);
        free(sums);
    }
}

/* Packed sequences (no padding): S sequences' query rows side by side, R in all; sequence
 * s owns rows first[s] .. first[s + 1] - 1 and attends to its own keys and values, kv head g
 * at ks[s] + g kvsh[s] (and vs[s] likewise), rows of D floats. q: element (h, t, d) at
 * q[h qsh + t qst + d], t over all R rows; lo, hi: [R]; out: [R, H, D] contiguous. Each
 * row's arithmetic is bs_attention's for that sequence alone (bitwise the same); the jobs
 * (sequence, kv head, block of a sequence's rows) are shared out over the threads for calls
 * of PARALLEL_MIN_ROWS rows or more, as bs_attention's. */
__attribute__((target("avx2,fma"))) void bs_attention_packed(
    const float *q, int64_t qsh, int64_t qst, const int64_t *ks, const int64_t *vs, const int64_t *kvsh,
    const int64_t *first, int64_t S, const int64_t *lo, const int64_t *hi, float *out, int64_t H, int64_t KVH,
    int64_t D, float scale, int threads) {
    const int64_t G = H / KVH;
    const int64_t G3 = (G + 2) / 3 * 3;
    const int64_t R = first[S];
    int64_t L = 1, jobs = 0;
    for (int64_t i = 0; i < R; ++i)
        if (hi[i] > L) L = hi[i];
    for (int64_t s = 0; s < S; ++s) jobs += KVH * ((first[s + 1] - first[s] + ROW_BLOCK - 1) / ROW_BLOCK);
    int64_t *table = (int64_t *)malloc((size_t)(jobs > 0 ? jobs : 1) * 3 * sizeof(int64_t)); /* (s, g, t0) */
    int64_t n = 0;
    for (int64_t s = 0; s < S; ++s)
        for (int64_t g = 0; g < KVH; ++g)
            for (int64_t t0 = first[s]; t0 < first[s + 1]; t0 += ROW_BLOCK) {
                table[3 * n] = s;
                table[3 * n + 1] = g;
                table[3 * n + 2] = t0;
                ++n;
            }
#pragma omp parallel num_threads(threads) if (threads > 1 && R >= PARALLEL_MIN_ROWS)
    {
        float *w = (float *)malloc((size_t)(ROW_BLOCK * G3 * L) * sizeof(float));
        float *acc = (float *)malloc((size_t)(ROW_BLOCK * G3 * D) * sizeof(float));
        float *sums = (float *)malloc((size_t)(ROW_BLOCK * G3) * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t job = 0; job < jobs; ++job) {
            const int64_t s = table[3 * job], g = table[3 * job + 1], t0 = table[3 * job + 2];
            const int64_t rows = (first[s + 1] - t0) < ROW_BLOCK ? (first[s + 1] - t0) : ROW_BLOCK;
            const float *kb = (const float *)(intptr_t)ks[s] + g * kvsh[s];
            const float *vb = (const float *)(intptr_t)vs[s] + g * kvsh[s];
            attend_block(q + t0 * qst, qsh, qst, kb, vb, lo + t0, hi + t0, rows, g, G, G3, H, D, L, scale,
                         out + t0 * H * D, w, acc, sums);
        }
        free(w);
        free(acc);
        free(sums);
    }
    free(table);
}
