/* The "native" target backend's forward: a Llama-architecture decoder over BF16 weights, in C.
 *
 * specdemo/models/native/build.py compiles this file once per machine with the system C
 * compiler (-O3 -march=native) and calls it through ctypes. One call computes a whole forward
 * over S new tokens (embeddings, every layer, the final norm, the output head for the last
 * `keep` positions, and the hidden states a learned drafter reads), so a forward costs one
 * Python call instead of ~2,000 operator calls, and the weights are read once per forward
 * whatever S is (each weight block is used for every token of the forward while in registers).
 *
 * Numbers: weights BF16 (the float32 weights rounded to nearest even), activations, KV cache,
 * norms, rotary embeddings, softmax and accumulation float32 (kernel "fma"); or, with kernel
 * "dpbf16" (CPUs with AVX512-BF16 only), activations rounded to BF16 for the multiplies and
 * accumulated in float32 by VDPBF16PS. With int8 weights (nf_set_scales: native-int8) the fma
 * kernel widens them to float32; after nf_quantize_activations (native-w8a8) the activations are
 * int8 too, one scale per 32 values a token, and each block of 32 products is summed exactly in
 * int32 (block_q8). In every kernel the result for a token does not depend
 * on the other tokens of the forward: every dot product runs the same instructions in the same
 * order whatever the batch, and attention is computed per query over the keys up to its
 * position. So a verification forward over [last token, d1..dk] gives each position exactly
 * the logits that one-token forwards give it, and greedy speculative decoding equals plain
 * greedy decoding on this backend bit for bit.
 *
 * Layout (row-major, as torch stores them): a linear's weight is (M, K) BF16, y = x W^T;
 * qkv is [q; k; v] (n_head + 2 n_kv) * D rows, gate_up is [gate; up] 2 * I rows. KV cache:
 * float32 (n_layer, n_kv, capacity, D), owned by the caller. Rotary tables: float32
 * (capacity, D) cos and sin, transformers' "rotate half" layout, owned by the caller.
 * Threads: an OpenMP team when compiled with -fopenmp (torch's own runtime in a torch process,
 * see pool_run), else a pool of n_threads - 1 workers that spin ~0.2 ms for the next operator,
 * then sleep.
 */

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define NF_MAX_THREADS 64
/* NF_V8: the fma kernel accumulates in 8-lane vectors (one AVX register each), on x86 CPUs with
 * AVX but not AVX-512. GCC (12, -march=znver3) keeps 64-byte vectors it has no register for in
 * memory, so the 16-lane kernel ran its accumulators through the stack there: forward(1) 26 ms
 * and forward(8) 6.5x that on a 2-core AMD EPYC (Zen 3, AVX2). */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) && !defined(NF_NO_V8)
#define NF_V8 1
#endif
#ifndef TB
#define TB 4 /* tokens per register block (RB * TB accumulators in registers), at most 8 */
#endif
#ifndef RB
#define RB 4 /* rows per block of a repacked weight (the rows weights.repack is given) */
#endif
#ifndef PF
#define PF 0 /* software prefetch distance in BF16 elements of a weight stream (0: none) */
#endif

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef uint32_t vu16 __attribute__((vector_size(64), aligned(4)));
typedef uint16_t vh16 __attribute__((vector_size(32), aligned(2)));

/* ------------------------------------------------------------------------------ thread pool */

typedef void (*nf_task)(void *arg, int ith, int nth);

typedef struct {
    int nth;
    pthread_t th[NF_MAX_THREADS];
    atomic_int gen;
    atomic_int done;
    atomic_int stop;
    nf_task fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} nf_pool;

typedef struct {
    nf_pool *pool;
    int ith;
} nf_worker;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define SPIN_S 2e-4

static void *worker_main(void *p) {
    nf_worker *w = (nf_worker *)p;
    nf_pool *pool = w->pool;
    int seen = 0; /* the generation at pool_start: a task posted before this thread runs counts */
    for (;;) {
        double t0 = now_s();
        int spins = 0;
        while (atomic_load_explicit(&pool->gen, memory_order_acquire) == seen &&
               !atomic_load(&pool->stop)) {
            cpu_relax();
            if (++spins % 256 == 0 && now_s() - t0 > SPIN_S) {
                pthread_mutex_lock(&pool->mu);
                while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                    pthread_cond_wait(&pool->cv, &pool->mu);
                pthread_mutex_unlock(&pool->mu);
            }
        }
        if (atomic_load(&pool->stop)) break;
        seen = atomic_load(&pool->gen);
        pool->fn(pool->arg, w->ith, pool->nth);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    }
    free(w);
    return NULL;
}

static int pool_start(nf_pool *pool, int nth) {
    memset(pool, 0, sizeof *pool);
    if (nth < 1) nth = 1;
    if (nth > NF_MAX_THREADS) nth = NF_MAX_THREADS;
    pool->nth = nth;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
#ifdef _OPENMP
    return 0; /* OpenMP's team runs the tasks (pool_run) */
#endif
    for (int i = 1; i < nth; i++) {
        nf_worker *w = malloc(sizeof *w);
        if (!w) return -1;
        w->pool = pool;
        w->ith = i;
        if (pthread_create(&pool->th[i], NULL, worker_main, w) != 0) {
            free(w);
            pool->nth = i;
            return -1;
        }
    }
    return 0;
}

static void pool_stop(nf_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
#ifndef _OPENMP
    for (int i = 1; i < pool->nth; i++) pthread_join(pool->th[i], NULL);
#endif
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
}

/* Run fn(arg, ith, nth) on every thread of the pool (the caller is thread 0); return when all
 * are done. Built with OpenMP (-fopenmp), the threads are an OpenMP team instead: in a Python
 * process with torch that is torch's own runtime (libgomp.so.1 is loaded once per process), so
 * torch's threads (a drafter's forward) and ours are the same threads and never spin against
 * each other for the cores; the pool's own threads are then not started. */
static void pool_run(nf_pool *pool, nf_task fn, void *arg) {
    if (pool->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(pool->nth)
    fn(arg, omp_get_thread_num(), omp_get_num_threads());
    return;
#endif
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    fn(arg, 0, pool->nth);
    while (atomic_load_explicit(&pool->done, memory_order_acquire) < pool->nth - 1) cpu_relax();
}

/* ------------------------------------------------------------------------------ model */

typedef struct {
    const uint16_t *qkv, *o, *gate_up, *down; /* BF16; int8 (as int8_t) where a scale is set */
    const float *norm1, *norm2;
    const float *s_qkv, *s_o, *s_gate_up, *s_down; /* int8 weights: per-row scales, else NULL */
} nf_layer;

typedef struct {
    int n_layer, hidden, n_head, n_kv, head_dim, inter, vocab, capacity, kernel;
    float eps, scaling;
    const float *embed; /* (vocab, hidden) float32 */
    const float *norm;  /* (hidden,) */
    const uint16_t *head; /* (vocab, hidden) BF16, or int8 with s_head */
    const float *s_head;  /* int8 output head: (vocab rounded up to RB, RBQ with act_q8) row scales, else NULL */
    int act_q8;           /* int8 weights multiply int8 activations (nf_quantize_activations) */
    nf_layer *layers;
    float *k_cache, *v_cache; /* (n_layer, n_kv, capacity, D) */
    const float *cos, *sin;   /* (capacity, D) */
    nf_pool pool;
    /* scratch, grown as needed */
    int scratch_tokens;
    float *x, *h, *qkv, *att, *gu, *act;
    uint16_t *xb; /* activations rounded to BF16 (kernel dpbf16), or int8 activations (bytes) */
    float *sx;    /* int8 activations: one scale per 32 values a token */
    int32_t *xsum; /* int8 activations: -128 * the sum of each 32 (block_q8) */
    float *scores; /* per thread: capacity floats */
    int scores_cap;
    /* EAGLE-3 head mode (nf_head_create): one layer over concat(embed, hidden) of width 2H */
    int head_mode, head_flags, embed_vocab;
    const float *hidden_norm; /* (hidden,) */
    float *xin;               /* scratch (tokens, 2 * hidden) */
    /* nf_forward_rows: token t is at position row_pos[t] of the sequence whose cache rows start
     * at row_base[t]; NULL in nf_forward (one sequence: positions start..start+n-1 from row 0) */
    const int32_t *row_base, *row_pos;
    /* nf_set_tree: a draft tree in the next calls. Token t's rotary position is tree_pos[t]
     * (its cache row stays start + t); of the rows from tree_from on it sees only those whose
     * bit (row - tree_from) is set in tree_anc[t] (its ancestors and itself); NULL: causal */
    const int32_t *tree_pos;
    const uint64_t *tree_anc;
    int tree_from;
} nf_model;

enum { KERNEL_FMA = 0, KERNEL_DPBF16 = 1 };

/* rows per block of a repacked weight: weights.repack asks */
int nf_rows(void) { return RB; }

int nf_has_dpbf16(void) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

void *nf_create(int n_layer, int hidden, int n_head, int n_kv, int head_dim, int inter, int vocab,
                float eps, float scaling, int n_threads, int kernel) {
    if (hidden % 32 || inter % 32 || (n_head * head_dim) % 32 || head_dim % 2) return NULL;
    if (kernel == KERNEL_DPBF16 && !nf_has_dpbf16()) return NULL;
    nf_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->n_layer = n_layer;
    m->hidden = hidden;
    m->n_head = n_head;
    m->n_kv = n_kv;
    m->head_dim = head_dim;
    m->inter = inter;
    m->vocab = vocab;
    m->eps = eps;
    m->scaling = scaling;
    m->kernel = kernel;
    m->layers = calloc(n_layer, sizeof(nf_layer));
    if (!m->layers || pool_start(&m->pool, n_threads) != 0) {
        free(m->layers);
        free(m);
        return NULL;
    }
    return m;
}

void nf_free(void *p) {
    nf_model *m = (nf_model *)p;
    if (!m) return;
    pool_stop(&m->pool);
    free(m->layers);
    free(m->x); free(m->h); free(m->qkv); free(m->att); free(m->gu); free(m->act); free(m->xb);
    free(m->sx); free(m->xsum); free(m->scores); free(m->xin);
    free(m);
}

void nf_set_layer(void *p, int i, const uint16_t *qkv, const uint16_t *o, const uint16_t *gate_up,
                  const uint16_t *down, const float *norm1, const float *norm2) {
    nf_model *m = (nf_model *)p;
    nf_layer *l = &m->layers[i];
    l->qkv = qkv; l->o = o; l->gate_up = gate_up; l->down = down;
    l->norm1 = norm1; l->norm2 = norm2;
}

void nf_set_output(void *p, const float *embed, const float *norm, const uint16_t *head) {
    nf_model *m = (nf_model *)p;
    m->embed = embed; m->norm = norm; m->head = head;
}

/* Int8 weights for layer i (i = -1: the output head): each non-NULL scale array (rows rounded up
 * to RB, float32) says that the weight set for it by nf_set_layer / nf_set_output holds int8
 * values q (the same repacked layout, one byte a value) and w[o, k] = q[o, k] * scale[o]. With
 * nf_quantize_activations the weights are in block_q8's layout instead, rows rounded up to RBQ. */
void nf_set_scales(void *p, int i, const float *qkv, const float *o, const float *gate_up,
                   const float *down) {
    nf_model *m = (nf_model *)p;
    if (i < 0) {
        m->s_head = qkv;
        return;
    }
    nf_layer *l = &m->layers[i];
    l->s_qkv = qkv; l->s_o = o; l->s_gate_up = gate_up; l->s_down = down;
}

/* From now on every matmul over int8 weights (nf_set_scales) also quantises its activations:
 * each token's row x (K,) to int8 with one scale per 32 columns (absmax / 127, round to nearest
 * even: llama.cpp's Q8_0), multiplied with the weights in exact int32 sums per 32 columns
 * (block_q8, whose weight layout, blocks of RBQ rows, the caller repacks the int8 weights in).
 * A token's numbers still do not depend on the other tokens of a forward. Source: W8A8 integer
 * matmuls (SmoothQuant, Xiao et al. 2023; LLM.int8(), Dettmers et al. 2022); the block format and
 * the AVX2 u8 x s8 product with the weights' signs moved onto the activations are llama.cpp's
 * (ggml-cpu quants.c, mul_sum_i8_pairs); the unsigned offset for VPDPBUSD is oneDNN's and
 * llama.cpp's AMX/VNNI kernels' compensation. */
void nf_quantize_activations(void *p) { ((nf_model *)p)->act_q8 = 1; }

/* The caller's KV cache and rotary tables for positions 0..capacity-1 (set again after growing). */
void nf_set_cache(void *p, float *k_cache, float *v_cache, const float *cos, const float *sin,
                  int capacity) {
    nf_model *m = (nf_model *)p;
    m->k_cache = k_cache; m->v_cache = v_cache; m->cos = cos; m->sin = sin;
    m->capacity = capacity;
}

static int grow_scratch(nf_model *m, int s) {
    if (s > m->scratch_tokens) {
        int q = (m->n_head + 2 * m->n_kv) * m->head_dim;
        int widest = m->hidden > q ? m->hidden : q;
        if (2 * m->inter > widest) widest = 2 * m->inter;
        if (m->n_head * m->head_dim > widest) widest = m->n_head * m->head_dim;
        if (m->head_mode && 2 * m->hidden > widest) widest = 2 * m->hidden;
        free(m->xin);
        m->xin = m->head_mode ? malloc(sizeof(float) * s * 2 * m->hidden) : NULL;
        free(m->x); free(m->h); free(m->qkv); free(m->att); free(m->gu); free(m->act); free(m->xb);
        free(m->sx); free(m->xsum);
        m->sx = malloc(sizeof(float) * s * (widest / 32 + 1));
        m->xsum = malloc(sizeof(int32_t) * s * (widest / 32 + 1));
        m->x = malloc(sizeof(float) * s * m->hidden);
        m->h = malloc(sizeof(float) * s * m->hidden);
        m->qkv = malloc(sizeof(float) * s * q);
        m->att = malloc(sizeof(float) * s * m->n_head * m->head_dim);
        m->gu = malloc(sizeof(float) * s * 2 * m->inter);
        m->act = malloc(sizeof(float) * s * m->inter);
        m->xb = malloc(sizeof(uint16_t) * s * widest);
        m->scratch_tokens = s;
        if (!m->x || !m->h || !m->qkv || !m->att || !m->gu || !m->act || !m->xb || !m->sx || !m->xsum ||
            (m->head_mode && !m->xin)) {
            m->scratch_tokens = 0;
            return -1;
        }
    }
    if (m->capacity > m->scores_cap) {
        free(m->scores);
        m->scores = malloc(sizeof(float) * (size_t)m->capacity * m->pool.nth);
        m->scores_cap = m->scores ? m->capacity : 0;
        if (!m->scores) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ kernels */

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v16 load_bf16x16(const uint16_t *p) {
    vh16 h;
    memcpy(&h, p, sizeof h);
    vu16 u = __builtin_convertvector(h, vu16) << 16;
    v16 f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));
typedef int8_t vb16 __attribute__((vector_size(16), aligned(1)));

/* int8 -> float32 for 16 values */
static inline v16 load_i8x16(const int8_t *p) {
#if defined(__AVX512F__) /* GCC 12 converts the generic vector one byte at a time (scalar) */
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    v16 v;
    memcpy(&v, &f, sizeof v);
    return v;
#else
    vb16 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, v16);
#endif
}

/* vf: the vector the elementwise code (attention, SiLU, exp) works in, VL floats: one AVX
 * register with NF_V8, else the 16-lane v16. */
#ifdef NF_V8
#define VL 8
typedef __m256 vf;
typedef int32_t vi __attribute__((vector_size(32)));
static inline vf loadv(const float *p) { return _mm256_loadu_ps(p); }
static inline void storev(float *p, vf v) { _mm256_storeu_ps(p, v); }
#else
#define VL 16
typedef v16 vf;
typedef vi16 vi;
static inline vf loadv(const float *p) { return load16(p); }
static inline void storev(float *p, vf v) { memcpy(p, &v, sizeof v); }
#endif

/* mask ? a : b, lane by lane (mask: a vector comparison's all-ones / zero lanes) */
static inline vf vselect(vi mask, vf a, vf b) {
    vi ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    vi r = (mask & ai) | (~mask & bi);
    vf out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* e^x for VL floats (Cephes expf: range reduction by ln 2, degree-6 polynomial; ~1 ulp),
 * x clamped to [-87.3, 88.7]. The same instructions for every lane and every call, so a value's
 * result does not depend on its neighbours. */
static inline vf expv(vf x) {
    const vf hi = (vf){0} + 88.7228391f, lo = (vf){0} - 87.3365447f;
    x = vselect(x > hi, hi, x);
    x = vselect(x < lo, lo, x);
    vf kf = x * 1.44269504088896341f + 12582912.0f;
    kf = kf - 12582912.0f; /* round to nearest */
    vf r = x - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    vf z = r * r;
    vf y = 1.9875691500E-4f * r + 1.3981999507E-3f;
    y = y * r + 8.3334519073E-3f;
    y = y * r + 4.1665795894E-2f;
    y = y * r + 1.6666665459E-1f;
    y = y * r + 5.0000001201E-1f;
    y = y * z + r + 1.0f;
    vi k = __builtin_convertvector(kf, vi);
    vi bits = (k + 127) << 23;
    vf scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static inline float hsum16(v16 v) {
    /* a fixed pairwise order, the same for every call */
#if defined(__AVX512F__)
    __m512 z;
    memcpy(&z, &v, sizeof z);
    return _mm512_reduce_add_ps(z);
#endif
    float a[16];
    memcpy(a, &v, sizeof a);
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* The matrix kernels. A weight is stored repacked in blocks of RB rows: for every 32 columns,
 * the 32 values of row 0, then of rows 1..RB-1 (see weights.repack), so one block is
 * one stream read front to back (on the VMs measured, reading 4 rows interleaved at stride K
 * ran at 8.5 GB/s on one core against 21.5 GB/s for one stream). Each weight vector is used for
 * up to TB tokens while in a register, and a block stays in L1 while further tokens pass. */
#if TB > 8 || TB < 1
#error "TB must be 1..8"
#endif
#define CASE_NT(K, CALL) \
    case K:              \
        CALL(K);         \
        break;
#define SWITCH_NT(CALL)                                              \
    switch (nt) {                                                    \
        CASE_NT(1, CALL)                                             \
        IF_TB2(CASE_NT(2, CALL)) IF_TB3(CASE_NT(3, CALL))            \
        IF_TB4(CASE_NT(4, CALL)) IF_TB5(CASE_NT(5, CALL))            \
        IF_TB6(CASE_NT(6, CALL)) IF_TB7(CASE_NT(7, CALL))            \
        IF_TB8(CASE_NT(8, CALL))                                     \
        default: break;                                              \
    }
/* IF_TBk(x): x when TB >= k (no code for widths a register block never has) */
#if TB >= 2
#define IF_TB2(x) x
#else
#define IF_TB2(x)
#endif
#if TB >= 3
#define IF_TB3(x) x
#else
#define IF_TB3(x)
#endif
#if TB >= 4
#define IF_TB4(x) x
#else
#define IF_TB4(x)
#endif
#if TB >= 5
#define IF_TB5(x) x
#else
#define IF_TB5(x)
#endif
#if TB >= 6
#define IF_TB6(x) x
#else
#define IF_TB6(x)
#endif
#if TB >= 7
#define IF_TB7(x) x
#else
#define IF_TB7(x)
#endif
#if TB >= 8
#define IF_TB8(x) x
#else
#define IF_TB8(x)
#endif

#ifndef NF_PF_MIN
#define NF_PF_MIN 4 /* forwards of at least this many tokens prefetch the next block (0: never) */
#endif

/* Prefetch into L2 this pass's share of the next weight block `next` (NULL: none) at chunk k:
 * the passes over a block share the next block's lines evenly (global chunk g of passes x K/32
 * fetches chunk g / passes when g is a multiple of passes), so the memory streams while the
 * cores compute from L1. */
static inline __attribute__((always_inline)) void prefetch_next(const void *next, int k, int K,
                                                               int pass, int passes, const int esz) {
    if (!next) return;
    int g = pass * (K / 32) + k / 32;
    if (g % passes) return;
    const char *nk = (const char *)next + (size_t)(g / passes) * 32 * RB * esz;
    for (int off = 0; off < 32 * RB * esz; off += 64)
        __builtin_prefetch(nk + off, 0, 2); /* locality 2: L2 (prefetcht1 on x86) */
}

/* The block after wb when a forward of n tokens prefetches it (n >= NF_PF_MIN and this
 * thread has one more block), else NULL. */
static inline const void *next_block(const void *wb, int n, int K, int more, int esz) {
    return NF_PF_MIN > 0 && n >= NF_PF_MIN && more ? (const char *)wb + (size_t)RB * K * esz : NULL;
}

#ifdef NF_V8
/* BF16 -> float32 for 8 values: widen to 32 bits, shift into the high half */
static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

/* int8 -> float32 for 8 values */
static inline __m256 load_i8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

#endif

#if defined(__AVX2__)
/* a fixed pairwise order, the same for every call */
static inline float hsum8(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* a[i] + a[i+4] */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                              /* s4[0]+s4[2], s4[1]+s4[3] */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#endif
#ifdef NF_V8
#define hsumv hsum8
#else
#define hsumv hsum16
#endif

/* the fma kernel's weight loads and multiply-add in vf (VL lanes) */
#ifdef NF_V8
#define loadv_bf16 load_bf16x8
#define loadv_i8 load_i8x8
static inline vf fmav(vf w, vf x, vf acc) { return _mm256_fmadd_ps(w, x, acc); }
#else
#define loadv_bf16 load_bf16x16
#define loadv_i8 load_i8x16
static inline vf fmav(vf w, vf x, vf acc) { return acc + w * x; }
#endif

/* y[t0 + t, o + r] for t < NT (a compile-time constant at every call: the accumulators stay in
 * registers), r < RB: float32 FMA over BF16 (I8: int8, then times scale[r]) weights widened to
 * float32. wv: the repacked block. Accumulators are vf (VL lanes; RB * TB registers with
 * NF_V8); every lane adds its columns in the same order whatever NT is. */
static inline __attribute__((always_inline)) void block_fma(const float *x, int t0, const int NT,
                                                           int K, const void *wv, float *y,
                                                           int ldy, int rows, const void *next,
                                                           int pass, int passes, const int I8,
                                                           const float *scale) {
    const uint16_t *wb = (const uint16_t *)wv;
    const int8_t *wq = (const int8_t *)wv;
    vf acc[RB][TB];
    for (int r = 0; r < RB; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = (vf){0};
    for (int k = 0; k < K; k += 32) {
        const uint16_t *wk = wb + (size_t)k * RB;
        const int8_t *qk = wq + (size_t)k * RB;
        prefetch_next(next, k, K, pass, passes, I8 ? 1 : 2);
        for (int e = 0; e < 32; e += VL) {
            vf w[RB];
            for (int r = 0; r < RB; r++) w[r] = I8 ? loadv_i8(qk + r * 32 + e) : loadv_bf16(wk + r * 32 + e);
            for (int t = 0; t < NT; t++) {
                vf xv = loadv(x + (size_t)(t0 + t) * K + k + e);
                for (int r = 0; r < RB; r++) acc[r][t] = fmav(w[r], xv, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < rows; r++)
            y[(size_t)(t0 + t) * ldy + r] = I8 ? hsumv(acc[r][t]) * scale[r] : hsumv(acc[r][t]);
}

/* y[t, o] = sum_k x[t, k] * W[o, k] for row blocks [b0, b1), tokens t < n, M rows in all;
 * every (t, o) runs the same instruction sequence whatever n is. */
static inline __attribute__((always_inline)) void rows_fma_w(const float *x, int n, int K,
                                                             const void *W, int b0, int b1, int M,
                                                             float *y, int ldy, const int I8,
                                                             const float *S) {
    int passes = (n + TB - 1) / TB, esz = I8 ? 1 : 2;
    for (int b = b0; b < b1; b++) {
        const void *wb = (const char *)W + (size_t)b * RB * K * esz;
        int o = b * RB, rows = M - o < RB ? M - o : RB;
        const void *next = next_block(wb, n, K, b + 1 < b1, esz);
        for (int t0 = 0; t0 < n; t0 += TB) {
            int nt = n - t0 < TB ? n - t0 : TB;
#define CALL_FMA(NT) block_fma(x, t0, NT, K, wb, y + o, ldy, rows, next, t0 / TB, passes, I8, I8 ? S + o : NULL)
            SWITCH_NT(CALL_FMA)
        }
    }
}

/* ... BF16 weights (S NULL) or int8 weights with per-row scales S (M rounded up to RB,) */
static void rows_fma(const float *x, int n, int K, const void *W, int b0, int b1, int M, float *y,
                     int ldy, const float *S) {
    if (S)
        rows_fma_w(x, n, K, W, b0, b1, M, y, ldy, 1, S);
    else
        rows_fma_w(x, n, K, W, b0, b1, M, y, ldy, 0, NULL);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
static inline __attribute__((always_inline)) void block_dp(const uint16_t *xb, int t0, const int NT,
                                                          int K, const uint16_t *wb, float *y,
                                                          int ldy, int rows, const void *next,
                                                          int pass, int passes) {
    __m512 acc[RB][TB];
    for (int r = 0; r < RB; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        const uint16_t *wk = wb + (size_t)k * RB;
#if PF > 0
        for (int r = 0; r < RB; r++) _mm_prefetch((const char *)(wk + PF + r * 32), _MM_HINT_T0);
#endif
        prefetch_next(next, k, K, pass, passes, 2);
        __m512bh w[RB];
        for (int r = 0; r < RB; r++) w[r] = (__m512bh)_mm512_loadu_si512((const void *)(wk + r * 32));
        for (int t = 0; t < NT; t++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xb + (size_t)(t0 + t) * K + k));
            for (int r = 0; r < RB; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w[r], xv);
        }
    }
    for (int t = 0; t < NT; t++) {
#if RB == 4 && !defined(NF_PLAIN_REDUCE)
        /* the 4 rows' sums of token t together: 14 instructions instead of 4 reductions of ~10;
         * each sum adds its own lanes in the same order whatever the other rows hold */
        __m256 a[4];
        for (int r = 0; r < 4; r++)
            a[r] = _mm256_add_ps(_mm512_castps512_ps256(acc[r][t]),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][t]), 1)));
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        if (rows == 4) {
            _mm_storeu_ps(y + (size_t)(t0 + t) * ldy, sums);
        } else {
            float tmp[4];
            _mm_storeu_ps(tmp, sums);
            for (int r = 0; r < rows; r++) y[(size_t)(t0 + t) * ldy + r] = tmp[r];
        }
#else
        for (int r = 0; r < rows; r++) y[(size_t)(t0 + t) * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
#endif
    }
}

/* The same with activations in BF16 (xb: (n, K) BF16) and VDPBF16PS: 32 products a step. */
static void rows_dpbf16(const uint16_t *xb, int n, int K, const uint16_t *W, int b0, int b1,
                        int M, float *y, int ldy) {
    int passes = (n + TB - 1) / TB;
    for (int b = b0; b < b1; b++) {
        const uint16_t *wb = W + (size_t)b * RB * K;
        int o = b * RB, rows = M - o < RB ? M - o : RB;
        const void *next = next_block(wb, n, K, b + 1 < b1, 2);
        for (int t0 = 0; t0 < n; t0 += TB) {
            int nt = n - t0 < TB ? n - t0 : TB;
#define CALL_DP(NT) block_dp(xb, t0, NT, K, wb, y + o, ldy, rows, next, t0 / TB, passes)
            SWITCH_NT(CALL_DP)
        }
    }
}
#endif

/* Int8 weights times int8 activations (nf_quantize_activations). The weights are repacked for
 * this kernel alone (weights.repack_q8, nf_rows_q8): blocks of RBQ = 16 rows, each stored
 * 32 columns at a time as 8 groups of 4 columns, a group holding the 16 rows' 4 bytes one row
 * after another, so one 64-byte load gives 16 rows x 4 columns and a vector lane is an output row.
 * Per token, row and 32-column block the 32 products are summed exactly in int32; the row's
 * float32 sum then adds sx[t, b] times that sum block after block with one FMA, and the result is
 * multiplied by the row's scale. Every path below (AVX512-VNNI, AVX2, portable C: -DNF_NO_I8A_AVX2
 * builds it on x86 too) computes exactly these numbers, whatever the CPU and the number of tokens.
 * AVX512-VNNI (NF_VNNI): VPDPBUSD of the weights' bytes + 128 (unsigned) and 4 broadcast
 * activation bytes, started from -128 * sum of the block's activations (xsum), so 16 rows take
 * 8 instructions a block; a block's tokens lie next to each other (quantize_q8), so every
 * activation, scale and offset is one broadcast load at a constant offset. AVX2: VPMADDUBSW of
 * |q| and the activations with q's signs, then VPMADDWD (llama.cpp's mul_sum_i8_pairs; |q|,
 * |x| <= 127: no int16 sum saturates). */
#if defined(__AVX2__) && !defined(NF_NO_I8A_AVX2)
#define NF_I8A_AVX2 1
#endif
#if defined(NF_I8A_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512F__) && !defined(NF_NO_VNNI)
#define NF_VNNI 1
#endif
#define RBQ 16 /* rows per block of the integer kernel's weights (nf_rows_q8) */
#ifndef PFQ
#define PFQ 4096 /* software prefetch distance in bytes of the integer kernel's weight stream (0: none) */
#endif
#ifndef PFQ_MIN
#define PFQ_MIN 6 /* register blocks of at least this many tokens prefetch: with their longer
                   * compute the out-of-order window no longer runs far enough ahead to keep the
                   * memory busy (at 1-5 tokens prefetching measured no gain on a Zen 4, and
                   * +25-35% at one token on a Xeon with 21 GB/s: nf_set_prefetch chooses) */
#endif
/* the integer kernel's prefetch, set at run time (nf_set_prefetch): distance in bytes (0: none)
 * and the narrowest register block that prefetches */
static int pfq_dist = PFQ, pfq_min = PFQ_MIN;

/* Prefetch the integer kernels' weight stream `distance` bytes ahead (0: never) in register
 * blocks of at least `min_tokens` tokens; negative values keep the current setting. */
void nf_set_prefetch(int min_tokens, int distance) {
    if (min_tokens >= 0) pfq_min = min_tokens;
    if (distance >= 0) pfq_dist = distance & ~63;
}
int nf_prefetch_min(void) { return pfq_min; }
int nf_prefetch_min_default(void) { return PFQ_MIN; } /* the build's setting (nf_set_prefetch aside) */
int nf_prefetch_distance(void) { return pfq_dist; }
#ifndef TBQ /* tokens per register block of the integer kernel: 2 * TBQ accumulators + the weights */
#ifdef NF_VNNI
#define TBQ 8 /* 32 registers */
#else
#define TBQ 4 /* 16 registers */
#endif
#endif
#if TBQ > 8 || TBQ < 1
#error "TBQ must be 1..8"
#endif

int nf_rows_q8(void) { return RBQ; }

/* y[t0 + t, o + r] for t < NT, r < rows (<= RBQ) from one weight block wb (K / 32 chunks of
 * 8 groups x RBQ rows x 4 bytes); the activations in quantize_q8's layout (K / 32 column blocks,
 * each holding the n tokens one after another): xq (K / 32, n, 32) int8, sx (K / 32, n) float32
 * scales, xsum (K / 32, n) -128 * the sum of a block's int8 activations (NF_VNNI's offset);
 * scale (rows,) float32 */
static inline __attribute__((always_inline)) void block_q8(const int8_t *xq, const float *sx,
                                                          const int32_t *xsum, int n, int t0, const int NT,
                                                          int K, const int8_t *wb, float *y,
                                                          int ldy, int rows, const float *scale) {
    const int nb = K / 32;
#if defined(NF_VNNI)
    __m512 acc[TBQ];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b++) {
        const int8_t *wk = wb + (size_t)b * 32 * RBQ;
        if (NT >= pfq_min && pfq_dist)
            for (int j = 0; j < 8; j++) _mm_prefetch((const char *)(wk + pfq_dist + 64 * j), _MM_HINT_T0);
        __m512i w[8];
        for (int j = 0; j < 8; j++) w[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(wk + 64 * j)), off);
        /* block b's tokens lie one after another: one pointer, constant offsets per token */
        const int8_t *xb = xq + ((size_t)b * n + t0) * 32;
        const float *sb = sx + (size_t)b * n + t0;
        const int32_t *ob = xsum + (size_t)b * n + t0;
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const int8_t *xt = xb + 32 * t;
            __m512i s0 = _mm512_set1_epi32(ob[t]); /* -128 * the block's sum: one broadcast load */
            if (NT >= 3) { /* enough independent chains across tokens: one per token */
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    int32_t x0;
                    memcpy(&x0, xt + 4 * j, 4);
                    s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(x0));
                }
            } else {
                __m512i s1 = _mm512_setzero_si512();
                for (int j = 0; j < 8; j += 2) {
                    int32_t x0, x1;
                    memcpy(&x0, xt + 4 * j, 4);
                    memcpy(&x1, xt + 4 * j + 4, 4);
                    s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(x0));
                    s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(x1));
                }
                s0 = _mm512_add_epi32(s0, s1);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(sb[t]), acc[t]);
        }
    }
    const __mmask16 mask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
    const __m512 sc = _mm512_maskz_loadu_ps(mask, scale);
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * ldy, mask, _mm512_mul_ps(acc[t], sc));
#elif defined(NF_I8A_AVX2)
    (void)xsum;
    for (int h = 0; h < RBQ / 8; h++) { /* rows 8h..8h+7: one 256-bit lane each */
        if (8 * h >= rows) break;
        __m256 acc[TBQ];
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        const __m256i ones = _mm256_set1_epi16(1);
        for (int b = 0; b < nb; b++) {
            const int8_t *wk = wb + (size_t)b * 32 * RBQ + 32 * h;
            if (h == 0 && NT >= pfq_min && pfq_dist) /* the block's 512 bytes, once */
                for (int j = 0; j < 8; j++) _mm_prefetch((const char *)(wk + pfq_dist + 64 * j), _MM_HINT_T0);
            __m256i s[TBQ];
            for (int t = 0; t < NT; t++) s[t] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(wk + 64 * j)), aw = _mm256_abs_epi8(w);
                for (int t = 0; t < NT; t++) {
                    int32_t xj;
                    memcpy(&xj, xq + ((size_t)b * n + t0 + t) * 32 + 4 * j, 4);
                    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(xj), w));
                    s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p, ones));
                }
            }
            for (int t = 0; t < NT; t++)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_broadcast_ss(sx + (size_t)b * n + t0 + t), acc[t]);
        }
        int hr = rows - 8 * h < 8 ? rows - 8 * h : 8;
        __m256 sc = _mm256_loadu_ps(scale + 8 * h); /* scale is padded to RBQ rows */
        for (int t = 0; t < NT; t++) {
            float out[8];
            _mm256_storeu_ps(out, _mm256_mul_ps(acc[t], sc));
            memcpy(y + (size_t)(t0 + t) * ldy + 8 * h, out, sizeof(float) * hr);
        }
    }
#else
    (void)xsum;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < NT; t++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const int8_t *xt = xq + ((size_t)b * n + t0 + t) * 32;
                int32_t p = 0;
                for (int k = 0; k < 32; k++)
                    p += (int32_t)xt[k] * wb[(size_t)b * 32 * RBQ + (k / 4) * 4 * RBQ + r * 4 + k % 4];
                acc = fmaf((float)p, sx[(size_t)b * n + t0 + t], acc);
            }
            y[(size_t)(t0 + t) * ldy + r] = acc * scale[r];
        }
#endif
}

static void rows_q8(const int8_t *xq, const float *sx, const int32_t *xsum, int n, int K,
                    const void *W, int b0, int b1, int M, float *y, int ldy, const float *S) {
    for (int b = b0; b < b1; b++) {
        const int8_t *wb = (const int8_t *)W + (size_t)b * RBQ * K;
        int o = b * RBQ, rows = M - o < RBQ ? M - o : RBQ;
        for (int t0 = 0; t0 < n; t0 += TBQ) {
            int nt = n - t0 < TBQ ? n - t0 : TBQ;
#define CALL_Q8(NT) block_q8(xq, sx, xsum, n, t0, NT, K, wb, y + o, ldy, rows, S + o)
            switch (nt) { /* NT a compile-time constant at each call: accumulators in registers */
                case 1: CALL_Q8(1); break;
#if TBQ >= 2
                case 2: CALL_Q8(2); break;
#endif
#if TBQ >= 3
                case 3: CALL_Q8(3); break;
#endif
#if TBQ >= 4
                case 4: CALL_Q8(4); break;
#endif
#if TBQ >= 5
                case 5: CALL_Q8(5); break;
#endif
#if TBQ >= 6
                case 6: CALL_Q8(6); break;
#endif
#if TBQ >= 7
                case 7: CALL_Q8(7); break;
#endif
#if TBQ >= 8
                case 8: CALL_Q8(8); break;
#endif
            }
        }
    }
}

/* x (n, K) -> xq (K / 32, n, 32) int8 x_q = round(x / s) (to nearest even) with one
 * s = max|x| / 127 per 32 columns, sx (K / 32, n) (0 for an all-zero block): llama.cpp's Q8_0,
 * stored column block by column block (block_q8 reads one block of every token together);
 * xsum (K / 32, n) -128 * the sum of each block's x_q (block_q8's VNNI offset) */
static void quantize_q8(const float *x, int n, int K, int8_t *xq, float *sx, int32_t *xsum) {
    const int nb = K / 32;
    for (int t = 0; t < n; t++)
        for (int b = 0; b < nb; b++) {
            const float *xt = x + (size_t)t * K + b * 32;
            int8_t *q = xq + ((size_t)b * n + t) * 32;
#ifdef NF_I8A_AVX2
            /* the same numbers as the portable loop below (max and integer sums are exact) */
            const __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 m4 = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xt)),
                                                    _mm256_andnot_ps(sign, _mm256_loadu_ps(xt + 8))),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xt + 16)),
                                                    _mm256_andnot_ps(sign, _mm256_loadu_ps(xt + 24))));
            __m128 m2 = _mm_max_ps(_mm256_castps256_ps128(m4), _mm256_extractf128_ps(m4, 1));
            m2 = _mm_max_ps(m2, _mm_movehl_ps(m2, m2));
            m2 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
            float amax = _mm_cvtss_f32(m2);
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            sx[(size_t)b * n + t] = amax / 127.0f;
            const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
            __m256i v[4];
            for (int j = 0; j < 4; j++) {
                __m256 f = _mm256_mul_ps(_mm256_loadu_ps(xt + 8 * j), vinv);
                f = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi);
                v[j] = _mm256_cvtps_epi32(f);
            }
            /* 32-bit -> 16-bit -> 8-bit packs interleave 128-bit lanes: permute back in order */
            __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)q, b8);
            __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
            xsum[(size_t)b * n + t] = -128 * _mm_cvtsi128_si32(s4);
#else
            float amax = 0.0f;
            for (int k = 0; k < 32; k++) amax = fabsf(xt[k]) > amax ? fabsf(xt[k]) : amax;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            sx[(size_t)b * n + t] = amax / 127.0f;
            for (int k = 0; k < 32; k++) {
                float v = nearbyintf(xt[k] * inv);
                q[k] = (int8_t)(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
            }
            int32_t sum = 0;
            for (int e = 0; e < 32; e++) sum += q[e];
            xsum[(size_t)b * n + t] = -128 * sum;
#endif
        }
}

typedef struct {
    nf_model *m;
    const float *x;
    const uint16_t *xb;
    int n, K, M;
    const uint16_t *W;
    const float *S; /* int8 weights' row scales, else NULL */
    float *y;
    int q8; /* int8 activations: xb holds them (bytes), m->sx their scales, m->xsum (block_q8) */
    atomic_int next; /* the next unclaimed row block of the shared tail (mm_task) */
} mm_args;

#ifndef MM_OWN_PCT
#define MM_OWN_PCT 75 /* % of a matmul's row blocks split evenly up front; the rest claimed */
#endif
static int mm_own_pct = MM_OWN_PCT;

/* Experiments: the % of row blocks split evenly up front (100: all; the default MM_OWN_PCT) */
void nf_set_split_pct(int pct) { mm_own_pct = pct < 0 ? 0 : pct > 100 ? 100 : pct; }

static void mm_rows(mm_args *a, int b0, int b1) {
    if (a->q8) {
        rows_q8((const int8_t *)a->xb, a->m->sx, a->m->xsum, a->n, a->K, a->W, b0, b1, a->M, a->y, a->M, a->S);
        return;
    }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (a->m->kernel == KERNEL_DPBF16 && !a->S) {
        rows_dpbf16(a->xb, a->n, a->K, a->W, b0, b1, a->M, a->y, a->M);
        return;
    }
#endif
    rows_fma(a->x, a->n, a->K, a->W, b0, b1, a->M, a->y, a->M, a->S);
}

static void mm_task(void *p, int ith, int nth) {
    mm_args *a = (mm_args *)p;
    /* MM_OWN_PCT % of the row blocks split evenly, the rest claimed in small chunks by whichever
     * thread is done first: a thread that started late (woken from its wait) or reads memory
     * more slowly does not leave the other waiting at the end. A row's numbers do not depend on
     * which thread computes it. */
    int rb = a->q8 ? RBQ : RB, blocks = (a->M + rb - 1) / rb;
    int own = (int)((long)blocks * mm_own_pct / 100);
    int b0 = (int)((long)own * ith / nth), b1 = (int)((long)own * (ith + 1) / nth);
    if (b0 < b1) mm_rows(a, b0, b1);
    int chunk = (blocks - own) / (4 * nth);
    if (chunk < 1) chunk = 1;
    for (;;) {
        int c0 = own + atomic_fetch_add_explicit(&a->next, chunk, memory_order_relaxed);
        if (c0 >= blocks) break;
        mm_rows(a, c0, c0 + chunk < blocks ? c0 + chunk : blocks);
    }
}

/* y (n, M) = x (n, K) W^T with W (M, K) BF16 repacked in blocks of RB rows (M rounded up to
 * a multiple of RB, the extra rows zero), on every thread of the pool; with S, W holds int8
 * values in the same layout and row o is scaled by S[o] (float32 activations: the fma kernel;
 * after nf_quantize_activations, int8 activations: block_q8, W in its layout of RBQ rows) */
static void matmul(nf_model *m, const float *x, int n, int K, const uint16_t *W, const float *S,
                   int M, float *y) {
    mm_args a = {m, x, NULL, n, K, M, W, S, y, S && m->act_q8, 0};
    if (a.q8) {
        quantize_q8(x, n, K, (int8_t *)m->xb, m->sx, m->xsum);
        a.xb = m->xb;
    } else if (m->kernel == KERNEL_DPBF16 && !S) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
        for (size_t i = 0; i < (size_t)n * K; i += 32) /* K is a multiple of 32 */
            _mm512_storeu_si512((void *)(m->xb + i),
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
#endif
        a.xb = m->xb;
    }
    pool_run(&m->pool, mm_task, &a);
}

static void rms_norm(const float *x, const float *w, float *out, int n, int H, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * H;
        float *ot = out + (size_t)t * H;
        double ss = 0.0;
        for (int i = 0; i < H; i++) ss += (double)xt[i] * xt[i];
        float r = 1.0f / sqrtf((float)(ss / H) + eps);
        for (int i = 0; i < H; i++) ot[i] = w[i] * (xt[i] * r);
    }
}

/* transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) =
 * cat(-x[D/2:], x[:D/2]) */
static void rope(float *v, const float *cos, const float *sin, int D) {
    int half = D / 2;
    float tmp[1024];
    memcpy(tmp, v, sizeof(float) * D);
    for (int i = 0; i < half; i++) v[i] = tmp[i] * cos[i] - tmp[i + half] * sin[i];
    for (int i = half; i < D; i++) v[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
}

/* q . k over D floats: VL-lane partial sums when D is a multiple of VL (a fixed order) */
static inline float dot(const float *q, const float *k, int D) {
    if (D % VL == 0) {
        vf acc = (vf){0};
        for (int d = 0; d < D; d += VL) acc += loadv(q + d) * loadv(k + d);
        return hsumv(acc);
    }
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += q[d] * k[d];
    return s;
}

/* q . k for 4 keys at once (D a multiple of 8): out[r] = q . k_r, each key's lanes added in
 * an order that does not depend on the other three keys (so a key's score is the same whichever
 * keys share its call; the tail of a row repeats its last key) */
static inline void dot4(const float *q, const float *k0, const float *k1, const float *k2,
                        const float *k3, int D, float *out) {
#if defined(__AVX2__) && defined(__FMA__) /* 8 lanes on AVX-512 too: the same scores as on AVX2 */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < D; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else
    out[0] = dot(q, k0, D); out[1] = dot(q, k1, D); out[2] = dot(q, k2, D); out[3] = dot(q, k3, D);
#endif
}

typedef struct {
    nf_model *m;
    int layer, n, start;
} att_args;

/* token t's position and the cache row its sequence starts at (nf_forward_rows), else start + t
 * and row 0 */
static inline int tok_pos(const nf_model *m, int start, int t) { return m->row_pos ? m->row_pos[t] : start + t; }
static inline int tok_base(const nf_model *m, int t) { return m->row_base ? m->row_base[t] : 0; }

/* attention of query (t, head) over its sequence's keys up to its position, for the pairs of
 * this thread */
static void att_task(void *p, int ith, int nth) {
    att_args *a = (att_args *)p;
    nf_model *m = a->m;
    int D = m->head_dim, H = m->n_head, G = m->n_head / m->n_kv;
    int q_width = (m->n_head + 2 * m->n_kv) * D;
    /* split the (token, head) pairs by cost (keys read: a token's position + 1), not by count:
     * in a batch of sequences (nf_forward_rows) the tokens' contexts differ */
    long total = 0;
    for (int t = 0; t < a->n; t++) total += (long)(tok_pos(m, a->start, t) + 1) * H;
    long lo = total * ith / nth, hi = total * (ith + 1) / nth, before = 0;
    int p0 = -1, p1 = a->n * H;
    for (int pi = 0; pi < a->n * H; pi++) { /* pair pi belongs to the thread whose share holds its start */
        if (p0 < 0 && before >= lo) p0 = pi;
        if (before >= hi) { p1 = pi; break; }
        before += tok_pos(m, a->start, pi / H) + 1;
    }
    if (p0 < 0) p0 = p1;
    float *scores = m->scores + (size_t)ith * m->capacity;
    size_t layer_off = (size_t)a->layer * m->n_kv * m->capacity * D;
    for (int pi = p0; pi < p1; pi++) {
        int t = pi / H, h = pi % H, kvh = h / G;
        const float *q = m->qkv + (size_t)t * q_width + (size_t)h * D;
        size_t first = (size_t)kvh * m->capacity + tok_base(m, t);
        const float *K = m->k_cache + layer_off + first * D;
        const float *V = m->v_cache + layer_off + first * D;
        int T = tok_pos(m, a->start, t) + 1;
        float mx = -INFINITY;
        if (D % 8 == 0) {
            for (int j = 0; j < T; j += 4) {
                float s4[4];
                const float *k0 = K + (size_t)j * D;
#define KEY(r) (j + (r) < T ? k0 + (size_t)(r) * D : K + (size_t)(T - 1) * D)
                dot4(q, k0, KEY(1), KEY(2), KEY(3), D, s4);
#undef KEY
                for (int r = 0; r < 4 && j + r < T; r++) {
                    float s = s4[r] * m->scaling;
                    scores[j + r] = s;
                    if (s > mx) mx = s;
                }
            }
        } else {
            for (int j = 0; j < T; j++) {
                float s = dot(q, K + (size_t)j * D, D) * m->scaling;
                scores[j] = s;
                if (s > mx) mx = s;
            }
        }
        const uint64_t anc = m->tree_anc ? m->tree_anc[t] : 0;
        if (m->tree_anc) { /* a draft tree: rows from tree_from on only when an ancestor */
            mx = -INFINITY;
            for (int j = 0; j < T; j++)
                if (j < m->tree_from || ((anc >> (j - m->tree_from)) & 1)) {
                    if (scores[j] > mx) mx = scores[j];
                }
        }
        float sum = 0.0f;
        int j = 0;
        for (; j + VL <= T; j += VL) storev(scores + j, expv(loadv(scores + j) - mx));
        if (j < T) { /* the tail through the same function, lanes past T unused */
            float tail[VL] = {0};
            memcpy(tail, scores + j, sizeof(float) * (T - j));
            storev(tail, expv(loadv(tail) - mx));
            memcpy(scores + j, tail, sizeof(float) * (T - j));
        }
        if (m->tree_anc)
            for (j = m->tree_from; j < T; j++)
                if (!((anc >> (j - m->tree_from)) & 1)) scores[j] = 0.0f;
        for (j = 0; j < T; j++) sum += scores[j];
        float *out = m->att + (size_t)t * H * D + (size_t)h * D;
        if (D % VL == 0 && D <= 256) {
            vf acc[256 / VL];
            int nv = D / VL;
            for (int c = 0; c < nv; c++) acc[c] = (vf){0};
            for (int j = 0; j < T; j++) {
                const float *vj = V + (size_t)j * D;
                float pj = scores[j];
                for (int c = 0; c < nv; c++) acc[c] += pj * loadv(vj + VL * c);
            }
            for (int c = 0; c < nv; c++) storev(out + VL * c, acc[c]);
        } else {
            for (int d = 0; d < D; d++) out[d] = 0.0f;
            for (int j = 0; j < T; j++) {
                const float *vj = V + (size_t)j * D;
                float pj = scores[j];
                for (int d = 0; d < D; d++) out[d] += pj * vj[d];
            }
        }
        float inv = 1.0f / sum;
        for (int d = 0; d < D; d++) out[d] *= inv;
    }
}

/* The rest of layer l once m->qkv (n, (n_head + 2 n_kv) D) holds its q, k, v: rotary
 * embeddings, the cache written at positions start..start+n-1 (tok_pos), attention, o_proj added to the
 * residual x (n, hidden), then the MLP added to x; h is scratch. Shared by the target's layers
 * and the EAGLE-3 head's. */
static void layer_rest(nf_model *m, int l, int n, int start, float *x) {
    const nf_layer *L = &m->layers[l];
    int Hd = m->hidden, D = m->head_dim;
    int qd = m->n_head * D, kvd = m->n_kv * D, q_width = qd + 2 * kvd;
    float *h = m->h;
    size_t layer_off = (size_t)l * m->n_kv * m->capacity * D;
    for (int t = 0; t < n; t++) {
        int pos = tok_pos(m, start, t), cache_row = tok_base(m, t) + pos;
        int rpos = m->tree_pos ? m->tree_pos[t] : pos; /* a tree node: at its depth */
        const float *c = m->cos + (size_t)rpos * D, *s = m->sin + (size_t)rpos * D;
        float *row = m->qkv + (size_t)t * q_width;
        for (int hh = 0; hh < m->n_head; hh++) rope(row + hh * D, c, s, D);
        for (int kh = 0; kh < m->n_kv; kh++) {
            float *k = row + qd + kh * D, *v = row + qd + kvd + kh * D;
            rope(k, c, s, D);
            memcpy(m->k_cache + layer_off + ((size_t)kh * m->capacity + cache_row) * D, k, sizeof(float) * D);
            memcpy(m->v_cache + layer_off + ((size_t)kh * m->capacity + cache_row) * D, v, sizeof(float) * D);
        }
    }
    att_args aa = {m, l, n, start};
    pool_run(&m->pool, att_task, &aa);
    matmul(m, m->att, n, qd, L->o, L->s_o, Hd, h);
    for (size_t i = 0; i < (size_t)n * Hd; i++) x[i] += h[i];
    rms_norm(x, L->norm2, h, n, Hd, m->eps);
    matmul(m, h, n, Hd, L->gate_up, L->s_gate_up, 2 * m->inter, m->gu);
    for (int t = 0; t < n; t++) {
        const float *g = m->gu + (size_t)t * 2 * m->inter, *u = g + m->inter;
        float *a = m->act + (size_t)t * m->inter;
        for (int i = 0; i < m->inter; i += VL) { /* inter is a multiple of 32 */
            vf gv = loadv(g + i);
            storev(a + i, gv / (1.0f + expv(-gv)) * loadv(u + i));
        }
    }
    matmul(m, m->act, n, m->inter, L->down, L->s_down, Hd, h);
    for (size_t i = 0; i < (size_t)n * Hd; i++) x[i] += h[i];
}

/* One forward over n new tokens at positions start..start+n-1.
 *   ids: (n,) token ids; keep: logits for the last `keep` positions into logits (keep, vocab);
 *   want: (n_want,) hidden-state indices (0 = embeddings, k = input of layer k, n_layer = the
 *   final norm's output), written to feats (n, n_want * hidden) in that order (feats may be
 *   NULL when n_want is 0).
 * Returns 0, or -1 (positions beyond the cache's capacity, or out of memory; nothing written
 * to the cache), -2 (a token id outside the vocabulary). */
/* nf_forward's body; keep_rows (keep,) non-NULL: logits for those tokens instead of the last keep */
static int forward(nf_model *m, const int32_t *ids, int n, int start, int keep, float *logits,
                   const int32_t *want, int n_want, float *feats, const int32_t *keep_rows) {
    int Hd = m->hidden, D = m->head_dim;
    int qd = m->n_head * D, kvd = m->n_kv * D, q_width = qd + 2 * kvd;
    for (int t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= m->vocab) return -2;
    if (grow_scratch(m, n) != 0) return -1;
    float *x = m->x, *h = m->h;
    for (int t = 0; t < n; t++) memcpy(x + (size_t)t * Hd, m->embed + (size_t)ids[t] * Hd, sizeof(float) * Hd);
    for (int l = 0; l <= m->n_layer; l++) {
        for (int w = 0; w < n_want; w++) {
            if (want[w] != l || l == m->n_layer) continue;
            for (int t = 0; t < n; t++)
                memcpy(feats + ((size_t)t * n_want + w) * Hd, x + (size_t)t * Hd, sizeof(float) * Hd);
        }
        if (l == m->n_layer) break;
        const nf_layer *L = &m->layers[l];
        rms_norm(x, L->norm1, h, n, Hd, m->eps);
        matmul(m, h, n, Hd, L->qkv, L->s_qkv, q_width, m->qkv);
        layer_rest(m, l, n, start, x);
    }
    rms_norm(x, m->norm, h, n, Hd, m->eps);
    for (int w = 0; w < n_want; w++) {
        if (want[w] != m->n_layer) continue;
        for (int t = 0; t < n; t++)
            memcpy(feats + ((size_t)t * n_want + w) * Hd, h + (size_t)t * Hd, sizeof(float) * Hd);
    }
    const float *last = h + (size_t)(n - keep) * Hd;
    if (keep_rows) { /* x (the residual) is free now: the kept rows one after another */
        for (int r = 0; r < keep; r++)
            memcpy(x + (size_t)r * Hd, h + (size_t)keep_rows[r] * Hd, sizeof(float) * Hd);
        last = x;
    }
    matmul(m, last, keep, Hd, m->head, m->s_head, m->vocab, logits);
    return 0;
}

int nf_forward(void *p, const int32_t *ids, int n, int start, int keep, float *logits,
               const int32_t *want, int n_want, float *feats) {
    nf_model *m = (nf_model *)p;
    if (n < 1 || keep < 1 || keep > n || start < 0 || start + n > m->capacity) return -1;
    m->row_base = m->row_pos = NULL;
    return forward(m, ids, n, start, keep, logits, want, n_want, feats, NULL);
}

/* One forward over n new tokens of several sequences sharing the cache (continuous batching):
 * token t is at position pos[t] of the sequence whose positions 0.. live in cache rows
 * base[t].. (rotary embeddings at pos[t], its key and value written at row base[t] + pos[t],
 * attention over rows base[t]..base[t] + pos[t]). A sequence's tokens in one call come in
 * position order after the positions already in its rows. Logits of the tokens keep_rows (keep,)
 * (indices into 0..n-1) into logits (keep, vocab). A token's numbers are the ones nf_forward
 * gives it in its sequence alone. Returns 0, -1 (a row beyond the capacity, a negative
 * position, a kept index out of range, out of memory), -2 (an id outside the vocabulary). */
int nf_forward_rows(void *p, const int32_t *ids, int n, const int32_t *base, const int32_t *pos,
                    const int32_t *keep_rows, int keep, float *logits) {
    nf_model *m = (nf_model *)p;
    if (n < 1 || keep < 1 || keep > n) return -1;
    for (int t = 0; t < n; t++)
        if (base[t] < 0 || pos[t] < 0 || base[t] + pos[t] >= m->capacity) return -1;
    for (int r = 0; r < keep; r++)
        if (keep_rows[r] < 0 || keep_rows[r] >= n) return -1;
    m->row_base = base;
    m->row_pos = pos;
    int rc = forward(m, ids, n, 0, keep, logits, NULL, 0, NULL, keep_rows);
    m->row_base = m->row_pos = NULL;
    return rc;
}

/* A draft tree for the next nf_forward / nf_head_forward calls (tree attention, as in SpecInfer
 * (Miao et al. 2024) and EAGLE-2): token t of a call is at rotary position pos[t] but in cache
 * row start + t; of the cache rows from `from` on it attends only to those whose bit
 * (row - from) is set in anc[t] (bit 63 at most: 64 rows). Rows before `from` are all seen.
 * pos NULL ends tree mode. The arrays are read during the calls and must outlive them. */
int nf_set_tree(void *p, const int32_t *pos, const uint64_t *anc, int from) {
    nf_model *m = (nf_model *)p;
    if (pos && (!anc || from < 0)) return -1;
    m->tree_pos = pos;
    m->tree_anc = pos ? anc : NULL;
    m->tree_from = pos ? from : 0;
    return 0;
}

/* ------------------------------------------------------------------------------ EAGLE-3 head */

/* The EAGLE-3 draft head (specdemo/core/drafters/eagle.py, Eagle3Head.step): one decoder layer
 * whose q/k/v read concat(input_layernorm(embed(id)), hidden_norm(hidden)) of width 2 hidden,
 * then the target's layer tail (layer_rest), the final norm and a draft-vocabulary lm_head.
 * Flags: NF_HEAD_NORM_BEFORE_RESIDUAL (the residual is hidden_norm(hidden) instead of hidden),
 * NF_HEAD_NORM_OUTPUT (the hidden returned for the next step is norm(out) instead of out).
 * The same model struct, kernels and thread team as a target: n_layer 1, vocab = the draft
 * vocabulary; the KV cache (1, n_kv, capacity, D) and rotary tables come from nf_set_cache. */
enum { NF_HEAD_NORM_BEFORE_RESIDUAL = 1, NF_HEAD_NORM_OUTPUT = 2 };

void *nf_head_create(int hidden, int n_head, int n_kv, int head_dim, int inter, int draft_vocab,
                     int embed_vocab, float eps, float scaling, int n_threads, int kernel,
                     int flags) {
    nf_model *m = nf_create(1, hidden, n_head, n_kv, head_dim, inter, draft_vocab, eps, scaling,
                            n_threads, kernel);
    if (!m) return NULL;
    m->head_mode = 1;
    m->head_flags = flags;
    m->embed_vocab = embed_vocab;
    return m;
}

/* qkv: [q; k; v] (.., 2 hidden) repacked; o, gate_up, down repacked as a target layer's;
 * input_ln, hidden_norm, post_ln, norm: (hidden,) float32; lm_head: (draft_vocab, hidden)
 * repacked; embed: the target's (embed_vocab, hidden) float32 embedding table. */
void nf_head_set(void *p, const uint16_t *qkv, const uint16_t *o, const uint16_t *gate_up,
                 const uint16_t *down, const float *input_ln, const float *hidden_norm,
                 const float *post_ln, const float *norm, const uint16_t *lm_head,
                 const float *embed) {
    nf_model *m = (nf_model *)p;
    nf_set_layer(p, 0, qkv, o, gate_up, down, input_ln, post_ln);
    m->hidden_norm = hidden_norm;
    nf_set_output(p, embed, norm, lm_head);
}

/* One head pass over n positions start..start+n-1.
 *   hidden_in: (n, hidden) float32 inputs (fc(features), or the previous step's output);
 *   ids: (n,) target ids of the tokens after those positions (embedding rows);
 *   keep: logits for the last `keep` positions into logits (keep, draft_vocab);
 *   hidden_out: (n, hidden) the output the next draft step reads (out, or norm(out) with
 *   NF_HEAD_NORM_OUTPUT).
 * Every position's numbers are independent of the others of the call (as nf_forward).
 * Returns 0, -1 (beyond the cache's capacity, or out of memory), -2 (an id outside the
 * embedding table), -3 (not a head model). */
int nf_head_forward(void *p, const float *hidden_in, const int32_t *ids, int n, int start,
                    int keep, float *logits, float *hidden_out) {
    nf_model *m = (nf_model *)p;
    if (!m->head_mode) return -3;
    int Hd = m->hidden, D = m->head_dim;
    int q_width = (m->n_head + 2 * m->n_kv) * D;
    if (n < 1 || keep < 1 || keep > n || start < 0 || start + n > m->capacity) return -1;
    for (int t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= m->embed_vocab) return -2;
    if (grow_scratch(m, n) != 0) return -1;
    float *x = m->x, *h = m->h, *xin = m->xin;
    const nf_layer *L = &m->layers[0];
    for (int t = 0; t < n; t++) {
        const float *ht = hidden_in + (size_t)t * Hd;
        float *row = xin + (size_t)t * 2 * Hd;
        rms_norm(m->embed + (size_t)ids[t] * Hd, L->norm1, row, 1, Hd, m->eps);
        rms_norm(ht, m->hidden_norm, row + Hd, 1, Hd, m->eps);
        memcpy(x + (size_t)t * Hd, (m->head_flags & NF_HEAD_NORM_BEFORE_RESIDUAL) ? row + Hd : ht,
               sizeof(float) * Hd);
    }
    matmul(m, xin, n, 2 * Hd, L->qkv, L->s_qkv, q_width, m->qkv);
    layer_rest(m, 0, n, start, x);
    rms_norm(x, m->norm, h, n, Hd, m->eps);
    memcpy(hidden_out, (m->head_flags & NF_HEAD_NORM_OUTPUT) ? h : x, sizeof(float) * n * Hd);
    matmul(m, h + (size_t)(n - keep) * Hd, keep, Hd, m->head, m->s_head, m->vocab, logits);
    return 0;
}
