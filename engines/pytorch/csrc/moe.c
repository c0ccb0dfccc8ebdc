/* A sparse mixture-of-experts block in one call (engines/pytorch/layers/moe.py, `FusedExperts`): routing from the
   router's logits, the chosen experts' projections grouped by expert, and the weighted sum added to the residual.
   Nothing of it is left to torch, so a decode step of an MoE model is kernel calls only and the step replay
   (step_replay.py) records it as one call whose data-dependent work (which experts, which rows) happens inside.

   Routing, as transformers' routers compute it (the table's T_ROUTING): Qwen3-MoE's and Mixtral's softmax of the
   logits in float32, then top-k of the probabilities, the k weights divided by their sum where the family
   normalises; or gpt-oss's top-k of the logits themselves, then a softmax over those k. Top-k with torch.topk's
   choice among ties (below). The experts run on csrc/gemm.c's kernels (their addresses are in the table Python
   builds), over the rows that chose the expert (ascending; the step's decode rows before its prompt rows, with
   gemm.c's modes as packed_blocks.py's `_Packed.row_parts` picks them), by the table's T_ACT: the fused gate-up-SiLU
   job, or (gpt-oss) the biased gate-up projection, the clamped SwiGLU (below) on its output in place, then the
   (biased) down projection. Experts no row chose are not read. Each (row, slot) output times its weight is summed in
   slot order in float32 (mul then add: the product rounded first, as transformers multiplies then sums), then added
   to the residual.

   Vector paths (AVX-512, AVX2) and a scalar one; the combination gives the same bits on each, the exp of the
   softmax and of the clamped SwiGLU's sigmoid is simd_exp.h's on the vector paths and libm's expf on the scalar
   one (within 2 ulp of each other). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "gemm_grouped.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include "simd_exp.h"
#endif
#if defined(__AVX512F__)
EXP16_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
EXP8_AVX2
#endif

/* The table (int64 words): a header, then per expert two projections (gate-up, down) of P_WORDS each. T_ALPHA and
   T_LIMIT hold a float's bits (the clamped SwiGLU's); P_BIAS a projection's bias (NB * 16 floats) or 0. */
enum { T_EXPERTS, T_TOP_K, T_ROUTING, T_SILU, T_F32, T_F32_PAR, T_BLOCKS, T_GROUPED, T_ACT, T_ALPHA, T_LIMIT,
       T_HEADER };
enum { P_KIND, P_W, P_SEGS, P_PTRS, P_NSEG, P_NB, P_TILE_UNIT, P_BIAS, P_WORDS };
/* T_ROUTING: softmax then top-k (the k weights as they are, or divided by their sum); top-k then softmax (gpt-oss) */
enum { R_SOFTMAX_TOP, R_SOFTMAX_TOP_NORMALIZE, R_TOP_SOFTMAX };
/* T_ACT: gate-up the fused SiLU job (K_SILU_*); or a projection of [gate | up] whose output the clamped SwiGLU
   activates in place */
enum { A_SILU, A_CLAMPED_SWIGLU };
/* P_KIND: how gemm.c reads the projection's weight */
enum { K_SILU_PANELS, K_SILU_BLOCKS, K_F32, K_F32_PAR, K_BLOCKS };
enum { F_PINNED = 1, F_INT8 = 2 };            /* flags: kernel_modes.decode_rows_pinned, .activations_int8 */
enum { TILE_MODE = 1, INT8_MODE = 2 };        /* gemm_blocks_par's `amx` (kernel_modes.py) */
enum { TILE_UNIT_MIN_ROWS = 16, TILE_UNIT_FEW_ROWS = 64, FEW_PANELS = 4, CHUNK_PANELS = 16, ROW_TILE = 192 };
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOP_K 17 /* torch sorts the first k - 1 by insertion up to 16 of them (below) */

typedef int (*silu_fn)(const float*, int64_t, const float*, const int*, const int64_t*, int, float*, int64_t, int,
                       int, int, int, int, int);
typedef void (*f32_fn)(const float*, int64_t, const float*, const float*, const float*, int64_t, float*, int64_t,
                       int, int, int);
typedef void (*f32_par_fn)(const float*, int64_t, const float*, const float*, const float*, int64_t, float*,
                           int64_t, int, int, int, int, int);
typedef int (*blocks_fn)(const float*, int64_t, const int*, const int64_t*, int, const float*, const float*,
                         int64_t, float*, int64_t, int, int, int, int, int, int);
typedef int (*grouped_fn)(const float*, int64_t, float*, int64_t, const grouped_part*, int, int, int, int, int, int,
                          int);

int moe_max_experts(void) { return MOE_MAX_EXPERTS; }
int moe_max_top_k(void) { return MOE_MAX_TOP_K; }
/* n experts, k chosen a row: what route takes */
static inline int routable(int n, int k, int rule) {
    return n <= MOE_MAX_EXPERTS && k <= MOE_MAX_TOP_K && k <= n && k >= 1 && rule >= R_SOFTMAX_TOP &&
           rule <= R_TOP_SOFTMAX;
}

/* ------------------------------------------------------------------------------------------------ routing */

/* torch.topk(largest, sorted) on CPU orders (value, index) pairs with libstdc++'s algorithms and a comparator on
   the values alone, so among equal values the order is theirs: std::partial_sort where k * 64 <= n, else
   std::nth_element at k - 1 and std::sort of the first k - 1. The same steps here, on the same comparator, give
   the same experts for tied probabilities (a zero router, experts with equal router rows). */
typedef struct { float v; int i; } pair;
static inline int before(pair a, pair b) { return (isnan(a.v) && !isnan(b.v)) || a.v > b.v; }
static inline void swap_pair(pair* a, pair* b) { pair t = *a; *a = *b; *b = t; }

static void insertion_sort(pair* first, pair* last) {
    if (first == last) return;
    for (pair* i = first + 1; i != last; i++) {
        pair val = *i;
        if (before(val, *first)) {
            memmove(first + 1, first, (size_t)(i - first) * sizeof(pair));
            *first = val;
        } else {
            pair* hole = i;
            pair* next = i - 1;
            while (before(val, *next)) *hole = *next, hole = next, next--;
            *hole = val;
        }
    }
}

static void push_heap(pair* first, int64_t hole, int64_t top, pair val) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && before(first[parent], val)) first[hole] = first[parent], hole = parent, parent = (hole - 1) / 2;
    first[hole] = val;
}

static void adjust_heap(pair* first, int64_t hole, int64_t len, pair val) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (before(first[child], first[child - 1])) child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    push_heap(first, hole, top, val);
}

static void make_heap(pair* first, pair* last) {
    const int64_t len = last - first;
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(first, parent, len, first[parent]);
        if (parent == 0) return;
    }
}

static inline void pop_heap(pair* first, pair* last, pair* result) {
    pair val = *result;
    *result = *first;
    adjust_heap(first, 0, last - first, val);
}

static void heap_select(pair* first, pair* middle, pair* last) {
    make_heap(first, middle);
    for (pair* i = middle; i < last; i++)
        if (before(*i, *first)) pop_heap(first, middle, i);
}

static void move_median_to_first(pair* result, pair* a, pair* b, pair* c) {
    if (before(*a, *b)) {
        if (before(*b, *c)) swap_pair(result, b);
        else if (before(*a, *c)) swap_pair(result, c);
        else swap_pair(result, a);
    } else if (before(*a, *c)) swap_pair(result, a);
    else if (before(*b, *c)) swap_pair(result, c);
    else swap_pair(result, b);
}

static pair* unguarded_partition(pair* first, pair* last, pair* pivot) {
    for (;;) {
        while (before(*first, *pivot)) first++;
        last--;
        while (before(*pivot, *last)) last--;
        if (!(first < last)) return first;
        swap_pair(first, last);
        first++;
    }
}

static void nth_element(pair* first, pair* nth, pair* last) {
    if (first == last || nth == last) return;
    int depth = 0;
    for (int64_t n = last - first; n > 1; n >>= 1) depth++;
    depth *= 2;  /* std::__lg(n) * 2 */
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth + 1, last);
            swap_pair(first, nth);
            return;
        }
        depth--;
        pair* mid = first + (last - first) / 2;
        move_median_to_first(first, first + 1, mid, last - 1);
        pair* cut = unguarded_partition(first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    insertion_sort(first, last);
}

/* The top k of q[0 .. n) as torch.topk(largest=True, sorted=True) orders them (k <= MOE_MAX_TOP_K). */
static void top_k(pair* q, int n, int k) {
    if ((int64_t)k * 64 <= n) {
        heap_select(q, q + k, q + n);
        for (pair* last = q + k; last - q > 1;) {  /* std::sort_heap */
            last--;
            pop_heap(q, last, last);
        }
    } else {
        nth_element(q, q + k - 1, q + n);
        insertion_sort(q, q + k - 1);  /* std::sort of k - 1 <= 16 elements */
    }
}

/* softmax(logits[0 .. n)) into p: exp(l - max) / sum, the sum in index order. */
static void softmax(const float* logits, int n, float* p) {
    float max = -INFINITY;
    for (int e = 0; e < n; e++) max = logits[e] > max ? logits[e] : max;
#if defined(__AVX512F__)
    float in[MOE_MAX_EXPERTS + 16];
    const int padded = (n + 15) / 16 * 16;
    memcpy(in, logits, (size_t)n * sizeof(float));
    for (int e = n; e < padded; e++) in[e] = max;  /* every value through the same vector exp: ties stay ties */
    for (int e = 0; e < padded; e += 16)
        _mm512_storeu_ps(p + e, exp16(_mm512_sub_ps(_mm512_loadu_ps(in + e), _mm512_set1_ps(max))));
#elif defined(__AVX2__) && defined(__FMA__)
    float in[MOE_MAX_EXPERTS + 8];
    const int padded = (n + 7) / 8 * 8;
    memcpy(in, logits, (size_t)n * sizeof(float));
    for (int e = n; e < padded; e++) in[e] = max;
    for (int e = 0; e < padded; e += 8)
        _mm256_storeu_ps(p + e, exp8(_mm256_sub_ps(_mm256_loadu_ps(in + e), _mm256_set1_ps(max))));
#else
    for (int e = 0; e < n; e++) p[e] = expf(logits[e] - max);
#endif
    float sum = 0.0f;
    for (int e = 0; e < n; e++) sum += p[e];
    const float inv = 1.0f / sum;
    for (int e = 0; e < n; e++) p[e] *= inv;
}

/* Each row's k experts (highest first) and their weights, from the router's logits [M, E] (ld apart), by `rule`.
   A NaN among a row's logits makes its probabilities NaN, ordered as torch orders them: the step's logits come out
   NaN and the sampler reports them. */
static void route(const float* logits, int64_t ldl, int m, int n, int k, int rule, int32_t* chosen,
                 float* weights) {
    float p[MOE_MAX_EXPERTS + 16];
    pair q[MOE_MAX_EXPERTS];
    for (int r = 0; r < m; r++) {
        const float* l = logits + r * ldl;
        if (rule == R_TOP_SOFTMAX) {  /* torch.topk of the logits, then softmax of those k (transformers' gpt-oss) */
            for (int e = 0; e < n; e++) q[e].v = l[e], q[e].i = e;
            top_k(q, n, k);
            float top[MOE_MAX_TOP_K];
            for (int s = 0; s < k; s++) top[s] = q[s].v, chosen[r * k + s] = q[s].i;
            softmax(top, k, p);  /* p: room for the vector paths' padding */
            memcpy(weights + r * k, p, (size_t)k * sizeof(float));
            continue;
        }
        softmax(l, n, p);
        for (int e = 0; e < n; e++) q[e].v = p[e], q[e].i = e;
        top_k(q, n, k);
        float sum = 0.0f;
        for (int s = 0; s < k; s++) sum += q[s].v;
        for (int s = 0; s < k; s++) {
            chosen[r * k + s] = q[s].i;
            weights[r * k + s] = rule == R_SOFTMAX_TOP_NORMALIZE ? q[s].v / sum : q[s].v;
        }
    }
}

/* ------------------------------------------------------------------------------------------------ activation */

/* gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`) of m rows of [gate | up] (each `width` wide,
   rows ld apart), written over the rows' gate halves: gate clamped from above at `limit`, up to [-limit, limit],
   out = (up + 1) * (gate * sigmoid(gate * alpha)), sigmoid(t) = 1 / (1 + exp(-t)), each op rounded as torch's (a
   NaN stays NaN, as torch's clamp keeps it). A row's tail (width not a multiple of the vector) goes through the
   same vector code, padded, so every value gets the same exp whatever its place. */
#if defined(__AVX512F__)
static inline __m512 clamped_swiglu16(__m512 g, __m512 u, float alpha, float limit) {
    const __m512 one = _mm512_set1_ps(1.0f), lim = _mm512_set1_ps(limit);
    g = _mm512_min_ps(lim, g);  /* the second operand where either is NaN: g */
    u = _mm512_max_ps(_mm512_set1_ps(-limit), _mm512_min_ps(lim, u));
    const __m512 t = _mm512_mul_ps(g, _mm512_set1_ps(alpha));
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), t))));
    return _mm512_mul_ps(_mm512_add_ps(u, one), _mm512_mul_ps(g, s));
}
#define ACT_LANES 16
#define ACT_VEC(g, u, out, alpha, limit) \
    _mm512_storeu_ps(out, clamped_swiglu16(_mm512_loadu_ps(g), _mm512_loadu_ps(u), alpha, limit))
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256 clamped_swiglu8(__m256 g, __m256 u, float alpha, float limit) {
    const __m256 one = _mm256_set1_ps(1.0f), lim = _mm256_set1_ps(limit);
    g = _mm256_min_ps(lim, g);
    u = _mm256_max_ps(_mm256_set1_ps(-limit), _mm256_min_ps(lim, u));
    const __m256 t = _mm256_mul_ps(g, _mm256_set1_ps(alpha));
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), t))));
    return _mm256_mul_ps(_mm256_add_ps(u, one), _mm256_mul_ps(g, s));
}
#define ACT_LANES 8
#define ACT_VEC(g, u, out, alpha, limit) \
    _mm256_storeu_ps(out, clamped_swiglu8(_mm256_loadu_ps(g), _mm256_loadu_ps(u), alpha, limit))
#endif

static void clamped_swiglu(float* gu, int64_t ld, int m, int width, float alpha, float limit) {
    for (int r = 0; r < m; r++) {
        float* g = gu + r * ld;
        const float* u = g + width;
#if defined(ACT_LANES)
        int c = 0;
        for (; c + ACT_LANES <= width; c += ACT_LANES) ACT_VEC(g + c, u + c, g + c, alpha, limit);
        if (c < width) {
            float tg[ACT_LANES] = {0}, tu[ACT_LANES] = {0}, to[ACT_LANES];
            memcpy(tg, g + c, (size_t)(width - c) * sizeof(float));
            memcpy(tu, u + c, (size_t)(width - c) * sizeof(float));
            ACT_VEC(tg, tu, to, alpha, limit);
            memcpy(g + c, to, (size_t)(width - c) * sizeof(float));
        }
#else
        for (int c = 0; c < width; c++) {
            const float gate = g[c] > limit ? limit : g[c];  /* NaN > limit is false: NaN stays */
            const float up = u[c] > limit ? limit : u[c] < -limit ? -limit : u[c];
            const float t = gate * alpha;
            const float s = 1.0f / (1.0f + expf(0.0f - t));
            g[c] = (up + 1.0f) * (gate * s);
        }
#endif
    }
}

static inline float word_float(int64_t word) {
    const uint32_t bits = (uint32_t)word;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ------------------------------------------------------------------------------------------------ experts */

/* Expert e's two projections in the table: gate-up, then down P_WORDS on. */
static inline const int64_t* expert_words(const int64_t* table, int e) {
    return table + T_HEADER + (int64_t)e * 2 * P_WORDS;
}

static inline int chunk_of(int mode, int m) {
    return mode == TILE_MODE && m <= TILE_UNIT_FEW_ROWS ? FEW_PANELS : CHUNK_PANELS;
}

/* The modes gemm.c runs a GGUF-blocks projection's decode rows (modes[0]) and prompt rows (modes[1]) in, as
   packed_blocks.py's `_Packed.row_parts` picks them: prompt rows on the tile unit where the weight is laid out for it,
   decode rows there too only when there are more than TILE_UNIT_MIN_ROWS of them, they are not pinned and the
   activations are float32; other rows in int8 or float32 as the flags say. */
static void row_modes(const int64_t* p, int decode, int flags, int modes[2]) {
    const int tile = (int)p[P_TILE_UNIT], other = flags & F_INT8 ? INT8_MODE : 0;
    modes[0] = tile && decode > TILE_UNIT_MIN_ROWS && !(flags & F_PINNED) && !other ? TILE_MODE : other;
    modes[1] = tile ? TILE_MODE : other;
}

/* One projection of an expert over m rows of x (the first `decode` of them decode rows) into y, its bias added
   where it has one; 0, -1 (a kernel's scratch could not be allocated) or -2 (an unknown kind, or a bias on the
   fused SiLU job, which takes none). */
static int project(const int64_t* table, const int64_t* p, const float* x, int64_t ldx, float* y, int64_t ldy, int m,
                   int decode, int k, int flags) {
    const int nb = (int)p[P_NB];
    const float* w = (const float*)p[P_W];
    const int* segs = (const int*)p[P_SEGS];
    const int64_t* ptrs = (const int64_t*)p[P_PTRS];
    const int nseg = (int)p[P_NSEG];
    const float* bias = (const float*)p[P_BIAS];
    switch ((int)p[P_KIND]) {
        case K_F32:
            ((f32_fn)table[T_F32])(x, ldx, w, bias, 0, 0, y, ldy, m, nb, k);
            return 0;
        case K_F32_PAR:
            ((f32_par_fn)table[T_F32_PAR])(x, ldx, w, bias, 0, 0, y, ldy, m, nb, k, CHUNK_PANELS,
                                           m < ROW_TILE ? m : ROW_TILE);
            return 0;
        case K_SILU_PANELS:
            if (bias) return -2;
            return ((silu_fn)table[T_SILU])(x, ldx, w, 0, 0, 0, y, ldy, m, nb, k, CHUNK_PANELS,
                                            m < ROW_TILE ? m : ROW_TILE, 0);
        case K_SILU_BLOCKS:
            if (bias) return -2;
            break;
        case K_BLOCKS: break;
        default: return -2;
    }
    /* GGUF blocks: decode rows and prompt rows in their modes */
    int modes[2];
    row_modes(p, decode, flags, modes);
    const int split = modes[0] == modes[1] ? m : decode;  /* one job where the modes agree */
    for (int i = 0; i < 2; i++) {
        const int a = i ? split : 0, rows = i ? m - split : split, mode = modes[i];
        if (rows <= 0) continue;
        const int mchunk = rows < ROW_TILE ? rows : ROW_TILE;
        const int rc = (int)p[P_KIND] == K_SILU_BLOCKS
                           ? ((silu_fn)table[T_SILU])(x + a * ldx, ldx, 0, segs, ptrs, nseg, y + a * ldy, ldy, rows,
                                                      nb, k, chunk_of(mode, rows), mchunk, mode)
                           : ((blocks_fn)table[T_BLOCKS])(x + a * ldx, ldx, segs, ptrs, nseg, bias, 0, 0,
                                                          y + a * ldy, ldy, rows, nb, k, chunk_of(mode, rows), mchunk,
                                                          mode);
        if (rc) return rc;
    }
    return 0;
}

/* The mode every row of an expert's projection runs in (project's modes), or -1 where its rows would not all run
   in one mode off the tile unit, or its weight is not GGUF blocks, or it has a bias (the grouped job adds none):
   then the experts run one by one. */
static int one_mode(const int64_t* p, int count, int decode, int flags) {
    if ((p[P_KIND] != K_SILU_BLOCKS && p[P_KIND] != K_BLOCKS) || p[P_BIAS]) return -1;
    int modes[2];
    row_modes(p, decode, flags, modes);
    const int mode = decode == count ? modes[0] : decode == 0 || modes[0] == modes[1] ? modes[1] : -1;
    return mode == TILE_MODE ? -1 : mode;
}

/* Every chosen expert's gate-up in one job, then every down projection in another (gemm.c's gemm_grouped_par),
   rather than two jobs an expert: parts[0 .. n) are the chosen experts' row ranges, `experts` their numbers. */
static int project_grouped(const int64_t* table, grouped_part* parts, const int32_t* experts, int n, float* xs,
                           int h, float* gs, int64_t ldg, float* ys, int64_t ldd, int width, int mode) {
    const grouped_fn grouped = (grouped_fn)table[T_GROUPED];
    int nb = 0;
    for (int proj = 0; proj < 2; proj++) {
        for (int i = 0; i < n; i++) {
            const int64_t* p = expert_words(table, experts[i]) + proj * P_WORDS;
            parts[i].segs = (const int*)p[P_SEGS], parts[i].ptrs = (const int64_t*)p[P_PTRS];
            parts[i].nseg = (int)p[P_NSEG], nb = (int)p[P_NB];
        }
        const int rc = proj == 0 ? grouped(xs, h, gs, ldg, parts, n, nb, h, CHUNK_PANELS, ROW_TILE, mode, 1)
                                 : grouped(gs, ldg, ys, ldd, parts, n, nb, width, CHUNK_PANELS, ROW_TILE, mode, 0);
        if (rc) return rc;
    }
    return 0;
}

/* out[r] = residual[r] + sum over slots s of ys[at[r k + s]] * weights[r k + s], in slot order (residual NULL:
   the sum alone). */
static void combine(const float* ys, int64_t ldy, const int32_t* at, const float* weights, const float* residual,
                    int64_t ldr, float* out, int64_t ldo, int m, int k, int h) {
    for (int r = 0; r < m; r++) {
        const float* w = weights + r * k;
        const int32_t* a = at + r * k;
        float* o = out + r * ldo;
        const float* res = residual ? residual + r * ldr : 0;
        int c = 0;
#if defined(__AVX512F__)
        for (; c + 16 <= h; c += 16) {
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(ys + a[0] * ldy + c), _mm512_set1_ps(w[0]));
            for (int s = 1; s < k; s++)
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(ys + a[s] * ldy + c), _mm512_set1_ps(w[s])));
            if (res) acc = _mm512_add_ps(_mm512_loadu_ps(res + c), acc);
            _mm512_storeu_ps(o + c, acc);
        }
#endif
#if defined(__AVX2__)
        for (; c + 8 <= h; c += 8) {
            __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(ys + a[0] * ldy + c), _mm256_set1_ps(w[0]));
            for (int s = 1; s < k; s++)
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(ys + a[s] * ldy + c), _mm256_set1_ps(w[s])));
            if (res) acc = _mm256_add_ps(_mm256_loadu_ps(res + c), acc);
            _mm256_storeu_ps(o + c, acc);
        }
#endif
        for (; c < h; c++) {
            float acc = ys[a[0] * ldy + c] * w[0];
            for (int s = 1; s < k; s++) acc += ys[a[s] * ldy + c] * w[s];
            o[c] = res ? res[c] + acc : acc;
        }
    }
}

/* The routing alone (for tests and for steps that want the experts): chosen [M, k] int32, weights [M, k]; rule:
   the table's T_ROUTING. */
int moe_route_f32(const float* logits, int64_t ldl, int m, int n, int k, int rule, int32_t* chosen,
                  float* weights) {
    if (!routable(n, k, rule)) return -2;
    route(logits, ldl, m, n, k, rule, chosen, weights);
    return 0;
}

/* The block for rows x [M, H]: out = residual + sum of the chosen experts' outputs times their weights.
   logits: the router's [M, E]; table: see above; the experts' width I, the gate-up output's row stride ldg and
   the down output's ldd (their panels' columns); prompt_from: the first prompt row (M: none).
   Scratch (float): xs [M k, H], gs [M k, ldg], ys [M k, ldd], weights [M k]; iscratch (int32): chosen [M k],
   rows [M k] (the (row, slot) pairs grouped by expert), at [M k] (each pair's place among them), counts [E + 1].
   Returns 0, -1 (a kernel's scratch could not be allocated) or -2 (a table the kernel cannot run: too many
   experts, an unknown routing rule or activation, or a chosen expert of an unknown kind or one its activation
   does not take). With the clamped SwiGLU, gs holds a row's [gate | up] (ldg >= 2 I) and then its activation. */
int moe_experts_f32(const float* logits, int64_t ldl, const float* x, int64_t ldx, const float* residual,
                    int64_t ldr, float* out, int64_t ldo, int m, int h, int width, const int64_t* table,
                    float* scratch, int32_t* iscratch, int64_t ldg, int64_t ldd, int prompt_from, int flags) {
    const int n = (int)table[T_EXPERTS], k = (int)table[T_TOP_K], rule = (int)table[T_ROUTING];
    const int act = (int)table[T_ACT];
    if (!routable(n, k, rule) || (act != A_SILU && act != A_CLAMPED_SWIGLU)) return -2;
    const int64_t pairs = (int64_t)m * k;
    float* xs = scratch;
    float* gs = xs + pairs * h;
    float* ys = gs + pairs * ldg;
    float* weights = ys + pairs * ldd;
    int32_t* chosen = iscratch;
    int32_t* rows = chosen + pairs;
    int32_t* at = rows + pairs;
    int32_t* counts = at + pairs;
    route(logits, ldl, m, n, k, rule, chosen, weights);
    /* group the pairs by expert (a counting sort: rows ascending within an expert) */
    memset(counts, 0, (size_t)(n + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < pairs; i++) counts[chosen[i] + 1]++;
    for (int e = 0; e < n; e++) counts[e + 1] += counts[e];
    for (int64_t i = 0; i < pairs; i++) {
        const int32_t place = counts[chosen[i]]++;
        rows[place] = (int32_t)(i / k);
        at[i] = place;
    }
    /* counts[e] is now the end of expert e's pairs, counts[e - 1] (0 for e = 0) their start. The chosen experts
       (ascending) and their row ranges, their rows of x gathered into xs; one grouped job a projection where every
       chosen expert's rows run in one mode off the tile unit (the fused SiLU job's gate-up only), else two jobs
       an expert. */
    grouped_part parts[MOE_MAX_EXPERTS];
    int32_t experts[MOE_MAX_EXPERTS], decodes[MOE_MAX_EXPERTS];  /* decodes: each chosen expert's decode rows */
    int used = 0, mode = table[T_GROUPED] && act == A_SILU ? -2 : -1;
    for (int e = 0, start = 0; e < n; start = counts[e], e++) {
        const int count = counts[e] - start;
        if (!count) continue;
        int decode = 0;
        for (int i = start; i < counts[e]; i++) {
            if (rows[i] < prompt_from) decode++;
            memcpy(xs + (int64_t)i * h, x + rows[i] * ldx, (size_t)h * sizeof(float));
        }
        const int64_t* gate_up = expert_words(table, e);
        const int g = one_mode(gate_up, count, decode, flags), d = one_mode(gate_up + P_WORDS, count, decode, flags);
        if (mode != -1) mode = g >= 0 && g == d && (mode == -2 || mode == g) ? g : -1;
        parts[used].start = start, parts[used].end = counts[e], decodes[used] = decode, experts[used++] = e;
    }
    int rc = 0;
    if (mode >= 0)
        rc = project_grouped(table, parts, experts, used, xs, h, gs, ldg, ys, ldd, width, mode);
    else
        for (int i = 0; i < used && !rc; i++) {
            const int start = parts[i].start, count = parts[i].end - start, decode = decodes[i];
            const int64_t* gate_up = expert_words(table, experts[i]);
            const int fused = gate_up[P_KIND] == K_SILU_PANELS || gate_up[P_KIND] == K_SILU_BLOCKS;
            if (fused != (act == A_SILU)) return -2;
            rc = project(table, gate_up, xs + (int64_t)start * h, h, gs + start * ldg, ldg, count, decode, h, flags);
            if (!rc && act == A_CLAMPED_SWIGLU)
                clamped_swiglu(gs + start * ldg, ldg, count, width, word_float(table[T_ALPHA]),
                               word_float(table[T_LIMIT]));
            if (!rc)
                rc = project(table, gate_up + P_WORDS, gs + start * ldg, ldg, ys + start * ldd, ldd, count, decode,
                             width, flags);
        }
    if (rc) return rc == -2 ? -2 : -1;
    combine(ys, ldd, at, weights, residual, ldr, out, ldo, m, k, h);
    return 0;
}
