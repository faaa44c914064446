/* REST's datastore search (banditspec.drafters.rest_datastore, which builds and loads this
 * file as its own library: text search needs none of the engine's kernels, nor a vector ISA):
 * the suffix array `sa` of the corpus `tokens` (n ids, each document ended by a separator
 * larger than any id). Token ids compare as unsigned 32-bit values, a suffix that ends first
 * is the smaller (the same order as the big-endian bytes the Python search compares). */
#include <stdint.h>
#include <stdlib.h>

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
