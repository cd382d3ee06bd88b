/* The matmuls of one SmolLM2-135M forward through the native backend's kernel (dpbf16), timed
 * for n = 1..8 tokens: no attention, no norms, random BF16 weights (269 MB). What it separates:
 * streaming the weights from memory (the default) against computing alone (SMALL=1: every
 * matmul reads the same first weights, which stay in cache). HUGE=1 asks for huge pages.
 *
 *   cc -O3 -march=native -fopenmp [-DNF_PF_MIN=0] -o mm-bench scripts/native_mm_bench.c -lm -lpthread
 *   OMP_WAIT_POLICY=ACTIVE ./mm-bench [threads=2] [repeats=20]
 *
 * Prints per n the median and best milliseconds, the ratio of medians to n = 1 and the weight
 * bytes per second. INT8=1 times int8 weights with per-row scales (the native-int8 backend's
 * kernel, 135 MB); the BF16 run uses the dpbf16 kernel where the CPU has AVX512-BF16, else fma.
 * -DTB=.. -DRB=.. try other register blocks. */
#include <sys/mman.h>
#include "../specdemo/models/native/native_forward.c"
#include <stdio.h>
/* time the matmuls of one SmolLM2-135M forward (no attention, no norms) for n = 1..8 */
int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    int L = 30, H = 576, Q = 960, I = 1536, V = 49152;
    int i8 = getenv("INT8") != NULL, esz = i8 ? 1 : 2;
    nf_model *m = nf_create(L, H, 9, 3, 64, I, V, 1e-5f, 0.125f, nth,
                            nf_has_dpbf16() ? KERNEL_DPBF16 : KERNEL_FMA);
    m->capacity = 16; grow_scratch(m, 16);
    size_t per = (size_t)Q * H + (size_t)H * H + (size_t)2 * I * H + (size_t)H * I;
    size_t tot = per * L + (size_t)V * H;
    uint16_t *W = aligned_alloc(2<<20, (tot * esz + (2<<20)) & ~((size_t)(2<<20)-1));
    if (getenv("HUGE")) madvise(W, tot * esz, MADV_HUGEPAGE);
    float *S = NULL;
    if (i8) { S = malloc(sizeof(float) * V); for (int i = 0; i < V; i++) S[i] = 0.01f; }
    if (i8 && getenv("A8")) nf_quantize_activations(m); /* int8 activations too */
    int small = getenv("SMALL") != NULL;
    if (i8)
        for (size_t i = 0; i < tot; i++) ((int8_t *)W)[i] = (int8_t)((i * 2654435761u >> 20) % 255 - 127);
    else
        for (size_t i = 0; i < tot; i++) W[i] = 0x3c00 + (i * 2654435761u >> 20) % 256; /* small bf16 */
    float *x = malloc(sizeof(float) * 16 * V), *y = malloc(sizeof(float) * 16 * V);
    for (int i = 0; i < 16 * V; i++) x[i] = (((long)i * 7919) % 100) / 100.0f;
    double base = 0;
    for (int n = 1; n <= 8; n++) {
        double best = 1e9, times[64];
        for (int r = -(n == 1); r < reps; r++) { /* r = -1: one untimed pass (pages, caches, clocks) */
            double t0 = now_s();
            char *w = (char *)W;
#define MM(K, M) do { matmul(m, x, n, K, (const uint16_t *)w, S, M, y); w += (size_t)(M) * (K) * esz; } while (0)
            for (int l = 0; l < L; l++) {
                MM(H, Q);
                if (small) w = (char *)W;
                MM(H, H);
                MM(H, 2 * I);
                MM(I, H);
            }
            if (!small) MM(H, V);
            double t = now_s() - t0;
            if (r < 0) continue;
            times[r % 64] = t;
            if (t < best) best = t;
        }
        /* median */
        int k = reps < 64 ? reps : 64;
        for (int i = 0; i < k; i++) for (int j = i + 1; j < k; j++) if (times[j] < times[i]) { double tt = times[i]; times[i] = times[j]; times[j] = tt; }
        double med = times[k / 2];
        if (n == 1) base = med;
        printf("n=%d median %.2f ms best %.2f ms ratio %.2f  (%.1f GB/s)\n", n, med * 1e3, best * 1e3, med / base, tot * esz / med / 1e9);
    }
    return 0;
}
