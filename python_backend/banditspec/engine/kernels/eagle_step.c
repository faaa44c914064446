/* An Eagle draft head's incremental step in one native call (bs_eagle_step, below), on the
 * int8 GEMM (int8.c) and the attention (attention.c); the same math as
 * banditspec/eagle/fast_step.py. Draft numerics: not the exact kernels' guarantee. */
#include "common.h"

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
        bs_i8_gemm_rows(xin, T, 2 * H, w[1], strides[1], scales[1], QKV, qkv);
        residual = feat;
    } else {
        bs_i8_gemm_rows(xin, T, 2 * H, w[0], strides[0], scales[0], H, u);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < H; ++i) u[t * H + i] += fc_bias[i];
        bs_i8_gemm_rows(u, T, H, w[1], strides[1], scales[1], QKV, qkv);
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
    bs_i8_gemm_rows(attn, T, NH * D, w[2], strides[2], scales[2], H, x);
    for (int64_t i = 0; i < T * H; ++i) x[i] += residual[i];
    rms_norm_rows(x, T, H, H, norms[2], eps, hn, H);
    bs_i8_gemm_rows(hn, T, H, w[3], strides[3], scales[3], 2 * I, gu);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < I; ++i) {
            const float g = gu[t * 2 * I + i];
            act[t * I + i] = g / (1.0f + expf(-g)) * gu[t * 2 * I + I + i];
        }
    bs_i8_gemm_rows(act, T, I, w[4], strides[4], scales[4], H, hn);
    for (int64_t i = 0; i < T * H; ++i) x[i] += hn[i];
    if (eagle3)
        memcpy(out, x, sizeof(float) * T * H);
    else
        rms_norm_rows(x, T, H, H, norms[3], eps, out, H);
done:
    free(xin); free(u); free(qkv); free(q); free(attn); free(x); free(hn); free(gu); free(act); free(lo); free(hi);
    return status;
}
