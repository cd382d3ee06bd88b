#include <stdio.h>
#include "../../../../specdemo/models/native_forward.c" /* build from this folder */
#include <stdlib.h>
int main(int argc, char **argv) {
    int K = 576, M = argc > 1 ? atoi(argv[1]) : 1536, reps = argc > 2 ? atoi(argv[2]) : 6000;
    int8_t *W = aligned_alloc(64, (size_t)M * K); for (size_t i = 0; i < (size_t)M * K; i++) W[i] = (int8_t)(rand() % 255 - 127);
    float *S = aligned_alloc(64, M * 4); for (int i = 0; i < M; i++) S[i] = 0.01f;
    float *x = aligned_alloc(64, 8 * K * 4); for (int i = 0; i < 8 * K; i++) x[i] = (rand() % 1000) / 500.0f - 1;
    int8_t *xq = aligned_alloc(64, 8 * K); float *sx = aligned_alloc(64, 8 * K / 32 * 4); int32_t *xs = aligned_alloc(64, 8 * K / 32 * 4);
    float *y = aligned_alloc(64, (size_t)8 * M * 4);
    nf_set_prefetch(argc > 3 ? atoi(argv[3]) : 99, 4096);
    for (int n = 1; n <= 8; n++) {
        quantize_q8(x, n, K, xq, sx, xs);
        rows_q8(xq, sx, xs, n, K, W, 0, M / RBQ, M, y, M, S);
        double t0 = now_s();
        for (int r = 0; r < reps; r++) rows_q8(xq, sx, xs, n, K, W, 0, M / RBQ, M, y, M, S);
        double dt = (now_s() - t0) / reps;
        double macs = (double)n * M * K;
        printf("n=%d %.1f us  %.1f GMAC/s  %.1f MAC/cycle@2.9GHz  per-token %.1f us\n", n, dt * 1e6, macs / dt / 1e9, macs / dt / 2.9e9, dt * 1e6 / n);
    }
    return 0;
}
