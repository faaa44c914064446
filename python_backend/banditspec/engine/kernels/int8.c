/* Int8-weight small-M GEMM for drafting heads (the Eagle head's linears and LM-head rows):
 * y[M, N] = (x[M, K] @ Wq[N, K]^T) * scale[N], W quantized per output row to int8, x fp32
 * (not quantized). NOT the exact kernel (gemm.c): a draft head's numerics only change which
 * tokens it proposes, and drafts are verified.
 *
 * Why: a head call comes right after a target forward has evicted the caches, and torch's
 * dynamic int8 linear (fbgemm) then pays, on every layer whatever its size, for its
 * packed-weight metadata, activation quantization and code all cold.
 * This streams each weight byte once per call, in I8_GROUP panels of 16 int8 columns
 * (packed[p][k][j] = Wq[16 p + j][k], zero past N; N padded to whole groups), a block of
 * I8_KB values of k at a time: the block is widened to fp32 in L1 once, then every row
 * multiplies it (8 accumulators a row). Rows: at most I8_MAXM a call (bs_i8_gemm_rows, or
 * the caller, splits longer inputs).
 */
#include "common.h"

#define I8_GROUP 4
#define I8_KB 64
/* I8_MAXM, the most rows a call: common.h (bs_i8_gemm_rows splits by it) */

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
