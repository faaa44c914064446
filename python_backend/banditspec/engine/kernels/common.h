/* What the engine's kernels share: the panel width, the threading threshold and the
 * functions one kernel calls in another (gemm.c, attention.c, int8.c, eagle_step.c are
 * compiled together into one library, declared in engine/panel_kernel.py and built by
 * banditspec.native).
 *
 * Every file is compiled without a global -mavx2: only the kernels carry a target
 * attribute, and bs_panel_cpu_ok() (gemm.c) says whether the running CPU has AVX2 and
 * FMA, which every kernel of the library needs. Without -ffast-math, with
 * -fno-tree-vectorize and -std=c11 (no FMA contraction) no compiler choice reorders or
 * fuses a reduction: the orders written in the kernels are the orders computed, which
 * their exactness arguments rely on.
 */
#ifndef BANDITSPEC_KERNELS_COMMON_H
#define BANDITSPEC_KERNELS_COMMON_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Output columns per packed weight panel (one 512-bit or two 256-bit float vectors),
 * in the fp32 (gemm.c) and int8 (int8.c) layouts alike. */
#define PANEL 16

/* Threads only for calls of at least this many rows (prefill): a decoding or verify step
 * (1..17 rows) stays on one thread. On a machine whose cores are busy (Triton's other
 * model processes, the clients) every parallel region waits for a descheduled thread,
 * which made whole test runs several times slower; one thread already streams the weights. */
#define PARALLEL_MIN_ROWS 64

/* attention.c */
void bs_attention(const float *q, int64_t qsb, int64_t qsh, int64_t qst, const float *k, const float *v,
                  int64_t kvsb, int64_t kvsh, const int64_t *lo, const int64_t *hi, float *out, int64_t B,
                  int64_t H, int64_t KVH, int64_t T, int64_t D, float scale, int threads);

/* int8.c: the int8-weight GEMM, at most I8_MAXM rows a call */
#define I8_MAXM 16
void bs_i8_gemm(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed, int64_t stride,
                const float *scale, int64_t N, float *y, int64_t ldy);

/* Any number of rows (x [M, K] and y [M, N] contiguous): bs_i8_gemm over blocks of I8_MAXM rows. */
static inline void bs_i8_gemm_rows(const float *x, int64_t M, int64_t K, const int8_t *packed, int64_t stride,
                                   const float *scale, int64_t N, float *y) {
    for (int64_t m = 0; m < M; m += I8_MAXM)
        bs_i8_gemm(x + m * K, M - m < I8_MAXM ? M - m : I8_MAXM, K, K, packed, stride, scale, N, y + m * N, N);
}

#endif
