/* attn_decode.cu: ATTN_DECODE on the device (src/ops/attn_decode.c says what it computes
 * and what it replaces).
 *
 * A block per (query head h, sequence s), 256 threads: q's column of the head in shared
 * memory; a warp per cached position j <= pos[s] for the score (lanes stride the head's D
 * elements, a double sum across the warp, rounded once and then scaled, as the CPU does);
 * the block's maximum and double sum of expf(score - max); then a thread per output element
 * d sums p_j v_j over the positions in double. The scores of a block go to scratch memory
 * (n_ctx floats a block), so the context length meets no shared-memory limit. An id or a
 * position outside the cache gives NaN, as on the CPU.
 *
 * Given this token's keys and values (k_new, v_new), the first block of each KV head's
 * query heads (h % (H / Hkv) == 0) stores them into the caches at (pos[s], seq_ids[s]),
 * rounded to the cache's type, and every block reads position pos[s] from k_new and v_new
 * rounded the same way instead of from the cache (which another block may not have written
 * yet): the same numbers as SET_ROWS then ATTN_DECODE, one launch instead of three. */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op attn_decode_ops[] = {LT_OP_ATTN_DECODE};

enum { AD_Q, AD_K, AD_V, AD_IDS, AD_POS, AD_GATE, AD_KNEW, AD_VNEW };

#define AD_THREADS 256

static bool cache_ok(const struct lt_tensor *c, const struct lt_tensor *q)
{
    return (c->type == LT_TYPE_F32 || c->type == LT_TYPE_F16) &&
           c->nb[0] == lt_type_traits(c->type)->type_size && c->ne[0] == q->ne[0] &&
           c->ne[1] >= 1 && q->ne[1] % c->ne[1] == 0;
}

bool cu_attn_decode_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op != LT_OP_ATTN_DECODE) {
        snprintf(reason, reason_size, "%s is not ATTN_DECODE", lt_op_name(node->op));
        return false;
    }
    const struct lt_tensor *q = node->src[AD_Q], *k = node->src[AD_K], *v = node->src[AD_V],
                           *ids = node->src[AD_IDS], *pos = node->src[AD_POS],
                           *gate = node->src[AD_GATE];
    if (!cu_check_source(node, AD_Q, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, AD_K, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_source(node, AD_V, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_source(node, AD_IDS, CU_TYPES_I32, reason, reason_size) ||
        !cu_check_source(node, AD_POS, CU_TYPES_I32, reason, reason_size) ||
        (gate && !cu_check_source(node, AD_GATE, CU_TYPES_F32, reason, reason_size)))
        return false;
    const struct lt_tensor *kn = node->src[AD_KNEW], *vn = node->src[AD_VNEW];
    if (!kn != !vn || (kn && (!cu_check_source(node, AD_KNEW, CU_TYPES_F32, reason, reason_size) ||
                              !cu_check_source(node, AD_VNEW, CU_TYPES_F32, reason, reason_size))))
        return false;
    if (kn && (kn->ne[0] != k->ne[0] || kn->ne[1] != k->ne[1] || kn->ne[2] != 1 ||
               kn->ne[3] != q->ne[2] || !lt_same_shape(kn, vn))) {
        snprintf(reason, reason_size, "k_new and v_new are not [D, Hkv, 1, S]");
        return false;
    }
    const int64_t S = q->ne[2];
    if (q->ne[3] != 1 || !cache_ok(k, q) || !cache_ok(v, q) || !lt_same_shape(k, v) ||
        k->type != v->type) {
        snprintf(reason, reason_size,
                 "q is not [D, H, S] over f32 or f16 caches [D, Hkv, n_ctx, n_slots] alike");
        return false;
    }
    if (!lt_is_contiguous(ids) || !lt_is_contiguous(pos) || lt_nelements(ids) != S ||
        lt_nelements(pos) != S) {
        snprintf(reason, reason_size, "seq_ids and pos are not contiguous i32 [S]");
        return false;
    }
    if (gate && !lt_same_shape(gate, q)) {
        snprintf(reason, reason_size, "the gate is not of q's shape");
        return false;
    }
    if (node->ne[0] != q->ne[0] * q->ne[1] || node->ne[1] != S) {
        snprintf(reason, reason_size, "the result is not [D * H, S]");
        return false;
    }
    /* q's column in shared memory: at most 32 KiB */
    if (q->ne[1] * S > INT32_MAX || q->ne[0] > 8192) {
        snprintf(reason, reason_size, "%lld heads x %lld sequences of %lld: too large a launch",
                 (long long)q->ne[1], (long long)S, (long long)q->ne[0]);
        return false;
    }
    return cu_check_result_f32(node, reason, reason_size);
}

static __device__ __forceinline__ float kv_at(const struct cu_t &c, int64_t d, int64_t h,
                                              int64_t j, int64_t slot)
{
    const char *p = c.data + d * c.nb[0] + h * c.nb[1] + j * c.nb[2] + slot * c.nb[3];
    return c.type == LT_TYPE_F16 ? __half2float(*(const __half *)p) : *(const float *)p;
}

/* x as a cache of type `type` holds it */
static __device__ __forceinline__ float kv_round(int type, float x)
{
    return type == LT_TYPE_F16 ? __half2float(__float2half_rn(x)) : x;
}

static __device__ __forceinline__ void kv_store(const struct cu_t &c, int64_t d, int64_t h,
                                                int64_t j, int64_t slot, float x)
{
    char *p = (char *)c.data + d * c.nb[0] + h * c.nb[1] + j * c.nb[2] + slot * c.nb[3];
    if (c.type == LT_TYPE_F16)
        *(__half *)p = __float2half_rn(x);
    else
        *(float *)p = x;
}

static __global__ void attn_decode_kernel(struct cu_t q, struct cu_t k, struct cu_t v,
                                          const int32_t *ids, const int32_t *pos, struct cu_t gate,
                                          bool has_gate, struct cu_t kn, struct cu_t vn,
                                          bool has_new, float *y, float *scores, float scale)
{
    cu_pdl_enter();
    extern __shared__ float qs[]; /* [D] */
    __shared__ double red[32];
    __shared__ float redf[32];
    const int64_t D = q.ne[0], H = q.ne[1], n_ctx = k.ne[2], n_slots = k.ne[3];
    const int64_t h = blockIdx.x % H, s = blockIdx.x / H, kh = h / (H / k.ne[1]);
    const int64_t slot = ids[s], n = (int64_t)pos[s] + 1;
    float *out = y + s * D * H + h * D;
    if (slot < 0 || slot >= n_slots || n < 1 || n > n_ctx) {
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
            out[d] = __int_as_float(0x7fc00000);
        return;
    }
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = cu_getf(q, d, h, s, 0);
    if (has_new && h % (H / k.ne[1]) == 0) /* the KV head's first query head stores */
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            kv_store(k, d, kh, n - 1, slot, cu_getf(kn, d, kh, 0, s));
            kv_store(v, d, kh, n - 1, slot, cu_getf(vn, d, kh, 0, s));
        }
    __syncthreads();
    float *sc = scores + (int64_t)blockIdx.x * n_ctx;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int64_t j = warp; j < n; j += n_warps) {
        const bool fresh = has_new && j == n - 1; /* this token's key: from k_new */
        double dot = 0.0;
        for (int64_t d = lane; d < D; d += 32)
            dot += (double)qs[d] * (double)(fresh ? kv_round(k.type, cu_getf(kn, d, kh, 0, s))
                                                  : kv_at(k, d, kh, j, slot));
        dot = cu_warp_sum(dot);
        if (lane == 0)
            sc[j] = __fmul_rn((float)dot, scale);
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        mx = fmaxf(mx, sc[j]);
    mx = cu_block_max(mx, redf);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = cu_block_sum(sum, red); /* its barriers order the writes above before the reads below */
    const float inv = (float)(1.0 / sum);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        double o = 0.0;
        const int64_t n_cached = has_new ? n - 1 : n; /* this token's value: from v_new */
        for (int64_t j = 0; j < n_cached; j++)
            o += (double)__fmul_rn(sc[j], inv) * (double)kv_at(v, d, kh, j, slot);
        if (has_new)
            o += (double)__fmul_rn(sc[n - 1], inv) *
                 (double)kv_round(v.type, cu_getf(vn, d, kh, 0, s));
        float of = (float)o;
        if (has_gate)
            of = __fmul_rn(of, 1.0f / (1.0f + expf(-cu_getf(gate, d, h, s, 0))));
        out[d] = of;
    }
}

/* a score a (block, cache slot); a block a (head, sequence) */
static size_t scores_bytes(const struct lt_tensor *node)
{
    const struct lt_tensor *q = node->src[AD_Q], *k = node->src[AD_K];
    if (q->ne[1] * q->ne[2] == 0 || q->ne[0] == 0)
        return 0;
    return (size_t)(q->ne[1] * q->ne[2]) * (size_t)k->ne[2] * sizeof(float);
}

static void attn_decode_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    need[CU_SCRATCH_WORK] = scores_bytes(node);
}

lt_status cu_attn_decode_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_attn_decode_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const struct lt_tensor *q = node->src[AD_Q], *k = node->src[AD_K], *gate = node->src[AD_GATE];
    const struct lt_tensor *kn = node->src[AD_KNEW], *vn = node->src[AD_VNEW];
    const int64_t blocks = q->ne[1] * q->ne[2];
    if (blocks == 0 || q->ne[0] == 0)
        return LT_OK;
    void *scores;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, scores_bytes(node), &scores);
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, attn_decode_kernel, (unsigned)blocks, AD_THREADS,
                  (size_t)q->ne[0] * sizeof(float), cu_view(q), cu_view(k),
                  cu_view(node->src[AD_V]), (const int32_t *)node->src[AD_IDS]->data,
                  (const int32_t *)node->src[AD_POS]->data, cu_view(gate ? gate : q), gate != NULL,
                  cu_view(kn ? kn : q), cu_view(vn ? vn : q), kn != NULL, (float *)node->data,
                  (float *)scores, lt_get_param_f32(node, 0));
    return cu_launched("attn_decode");
}

const struct cu_family cu_family_attn_decode = {
    "attn_decode",          attn_decode_ops,    CU_COUNT(attn_decode_ops), cu_attn_decode_supported,
    cu_attn_decode_compute, attn_decode_scratch};
