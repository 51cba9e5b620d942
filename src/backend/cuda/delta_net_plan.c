/* delta_net_plan.c: the block split of the CUDA forward and backward of the gated delta
 * rule (see delta_net_plan.h). Compiled in every build: it needs no CUDA. */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/delta_net_plan.h"

bool cu_dn_fwd_plan_init(struct dn_fwd_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                      char *reason, size_t reason_size)
{
    if (sk <= 0 || sv <= 0 || hv <= 0 || nb < 0) {
        snprintf(reason, reason_size, "the forward's dims are not positive");
        return false;
    }
    if (sk > (int64_t)DN_FWD_ROW_GROUPS * DN_FWD_MAX_ROWS) {
        snprintf(reason, reason_size, "S_k %lld is over the forward kernel's %d", (long long)sk,
                 DN_FWD_ROW_GROUPS * DN_FWD_MAX_ROWS);
        return false;
    }
    p->rows = 1;
    while (p->rows * DN_FWD_ROW_GROUPS < sk)
        p->rows *= 2;
    p->chunks = (sv + DN_FWD_COLS - 1) / DN_FWD_COLS;
    p->blocks = hv * nb * p->chunks;
    if (p->blocks > 0x7fffffff) {
        snprintf(reason, reason_size, "too many heads and sequences for one grid");
        return false;
    }
    return true;
}

static int64_t plan_shared_floats(int64_t sk, int64_t cols, int64_t row_groups)
{
    return 2 * sk * cols + 4 * sk + row_groups * cols;
}

static int64_t plan_row_groups(int64_t sk, int64_t cols)
{
    int64_t r = 1;
    while (r < sk && r * cols < DN_BACK_THREADS)
        r *= 2;
    while (r * cols < 32) /* whole warps: the row sums shuffle within one */
        r *= 2;
    return r;
}

bool cu_dn_back_plan_init(struct dn_back_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                       int64_t nt, char *reason, size_t reason_size)
{
    if (sk <= 0 || sv <= 0 || hv <= 0 || nb < 0 || nt < 0) {
        snprintf(reason, reason_size, "the backward's dims are not positive");
        return false;
    }
    /* Chunks of 32 columns, narrowed while the grid is short of DN_BACK_TARGET_BLOCKS (the
     * 0.8B shape, 16 heads of S_v 128, gets 128 blocks of 16 columns), or while S and dS
     * do not fit in shared memory. */
    int64_t cols = 32;
    while (cols > 8 && hv * nb * ((sv + cols - 1) / cols) < DN_BACK_TARGET_BLOCKS)
        cols /= 2;
    while (cols > 8 &&
           (size_t)plan_shared_floats(sk, cols, plan_row_groups(sk, cols)) * sizeof(float) >
               DN_BACK_MAX_SHARED)
        cols /= 2;
    p->cols = cols;
    p->row_groups = plan_row_groups(sk, cols);
    p->threads = cols * p->row_groups;
    p->chunks = (sv + cols - 1) / cols;
    p->blocks = hv * nb * p->chunks;
    p->seg = nt > 1 ? (int64_t)ceil(sqrt((double)nt)) : 1;
    p->n_seg = nt > 0 ? (nt + p->seg - 1) / p->seg : 1;
    p->part_per_token = 2 * sk + 2;
    p->part_per_block = nt * p->part_per_token;
    p->work_per_block = (p->n_seg + p->seg) * sk * cols + p->seg * cols;
    p->shared_bytes = sizeof(float) * (size_t)plan_shared_floats(sk, cols, p->row_groups);
    if (p->shared_bytes > DN_BACK_MAX_SHARED) {
        snprintf(reason, reason_size,
                 "S_k %lld needs %zu bytes of shared memory, over the backward kernel's %u",
                 (long long)sk, p->shared_bytes, DN_BACK_MAX_SHARED);
        return false;
    }
    if (p->blocks > 0x7fffffff) {
        snprintf(reason, reason_size, "too many heads and sequences for one grid");
        return false;
    }
    return true;
}

/* floats of the chunked backward's shared memory: K and Q [DN_CHUNK][ldk]; S0 and dS
 * [skp][ldv]; W, U, Do, dU, Y [DN_CHUNK][ldv]; Ab, P, M [DN_CHUNK][ldc]; 8 vectors; a
 * 16 x 16 tile a warp (a39b620 stores the products' accumulators from registers, so nothing reads
 * those tiles now; they still count here, because taking them out changes the plans' sizes
 * and choices, which wants a device run first) */
static int64_t cback_shared_floats(int64_t skp, int64_t cv)
{
    const int64_t ldk = skp + 4, ldv = cv + 4, ldc = DN_CHUNK + 4;
    return 2 * DN_CHUNK * ldk + 2 * skp * ldv + 5 * DN_CHUNK * ldv + 3 * DN_CHUNK * ldc +
           8 * DN_CHUNK + DN_CBACK_THREADS / 32 * 256;
}

bool cu_dn_cback_plan_init(struct dn_cback_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                        int64_t nt, char *reason, size_t reason_size)
{
    if (sk <= 0 || sv <= 0 || hv <= 0 || nb < 0 || nt < 0) {
        snprintf(reason, reason_size, "the backward's dims are not positive");
        return false;
    }
    const int64_t skp = (sk + 15) / 16 * 16;
    /* 32 columns, narrowed to 16 while the grid is short of DN_BACK_TARGET_BLOCKS or shared
     * memory is over the limit */
    int64_t cv = 32;
    if (hv * nb * ((sv + cv - 1) / cv) < DN_BACK_TARGET_BLOCKS ||
        (size_t)cback_shared_floats(skp, cv) * sizeof(float) > DN_CBACK_MAX_SHARED)
        cv = 16;
    p->cv = cv;
    p->skp = skp;
    p->chunks = (sv + cv - 1) / cv;
    p->blocks = hv * nb * p->chunks;
    p->n_ch = (nt + DN_CHUNK - 1) / DN_CHUNK;
    p->ldk = skp + 4;
    p->ldv = cv + 4;
    p->ldc = DN_CHUNK + 4;
    p->part_per_token = 2 * sk + 2;
    p->part_per_block = nt * p->part_per_token;
    p->ckpt_per_block = p->n_ch * skp * cv;
    p->shared_bytes = sizeof(float) * (size_t)cback_shared_floats(skp, cv);
    if (p->shared_bytes > DN_CBACK_MAX_SHARED) {
        snprintf(reason, reason_size,
                 "S_k %lld needs %zu bytes of shared memory in the chunked backward, over %u",
                 (long long)sk, p->shared_bytes, DN_CBACK_MAX_SHARED);
        return false;
    }
    if (p->blocks > 0x7fffffff) {
        snprintf(reason, reason_size, "too many heads and sequences for one grid");
        return false;
    }
    return true;
}

/* floats of each wy kernel's shared memory (see delta_net_wy.cu for the buffers); the
 * vectors come last in each. (The warps' 16 x 16 staging tiles that followed them went with
 * a39b620, which stores the products' accumulators from registers.) */
static int64_t wy_tail(void)
{
    return DN_WY_VECS * DN_CHUNK;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* prep: K, Q [C][ldk]; V [C][ldw]; Ab, P, T, At [C][ldc] */
static int64_t wy_prep_floats(const struct dn_wy_plan *p)
{
    return 2 * DN_CHUNK * p->ldk + DN_CHUNK * p->ldw + 4 * DN_CHUNK * p->ldc + wy_tail();
}

/* fwd: S0 [skp][ldv]; Wk, K [C][ldk]; U [C][ldv] */
static int64_t wy_fwd_floats(const struct dn_wy_plan *p)
{
    return p->skp * p->ldv + 2 * DN_CHUNK * p->ldk + DN_CHUNK * p->ldv + wy_tail();
}

/* bwd: dS [skp][ldv]; Q over K [2C][ldk]; F [C][ldc]; G2 [C][ldk]; Do [C][ldv];
 * Z [2C][ldv] */
static int64_t wy_bwd_floats(const struct dn_wy_plan *p)
{
    return p->skp * p->ldv + 3 * DN_CHUNK * p->ldk + DN_CHUNK * p->ldc +
           3 * DN_CHUNK * p->ldv + wy_tail();
}

/* grad: Do, U, dR [C][ldw]; region A: M1, M2 [C][ldc], later the slices S0, dS [skp][lds]
 * and Y [C][lds]; region B: P, Ab [C][ldc], later Q, K [C][ldk] */
static int64_t wy_grad_region_a(const struct dn_wy_plan *p)
{
    return max64(2 * DN_CHUNK * p->ldc, 2 * p->skp * p->lds + DN_CHUNK * p->lds);
}

static int64_t wy_grad_region_b(const struct dn_wy_plan *p)
{
    return max64(2 * DN_CHUNK * p->ldk, 2 * DN_CHUNK * p->ldc);
}

static int64_t wy_grad_floats(const struct dn_wy_plan *p)
{
    return 3 * DN_CHUNK * p->ldw + wy_grad_region_a(p) + wy_grad_region_b(p) + wy_tail();
}

static void wy_set_cv(struct dn_wy_plan *p, int64_t sv, int64_t cv)
{
    p->cv = cv;
    p->svp = (sv + cv - 1) / cv * cv;
    p->cblocks = p->svp / cv;
    p->ldv = cv + 4;
    p->ldw = p->svp + 4;
}

bool cu_dn_wy_plan_init(struct dn_wy_plan *p, int64_t sk, int64_t sv, int64_t hk, int64_t hv,
                     int64_t nb, int64_t nt, char *reason, size_t reason_size)
{
    if (sk <= 0 || sv <= 0 || hk <= 0 || hv <= 0 || hv % hk != 0 || nb < 0 || nt < 0) {
        snprintf(reason, reason_size, "the backward's dims are not positive");
        return false;
    }
    const size_t F = sizeof(float);
    p->skp = (sk + 15) / 16 * 16;
    if (p->skp > 128) { /* grad holds dq and dk rows of at most 8 tiles (cb_acc64) */
        snprintf(reason, reason_size, "S_k %lld is past the chunk-parallel kernels' 128",
                 (long long)sk);
        return false;
    }
    p->ldk = p->skp + 4;
    p->ldc = DN_CHUNK + 4;
    /* The state passes' columns: DN_WY_MAX_CV (fewer blocks load each chunk's Q, K, P, T),
     * narrowed while their grid is short of DN_WY_TARGET_BLOCKS or bwd's shared memory is
     * over the limit (the widest of the two passes). */
    int64_t cv = DN_WY_MAX_CV;
    for (;;) {
        wy_set_cv(p, sv, cv);
        const bool short_grid = hv * nb * p->cblocks < DN_WY_TARGET_BLOCKS;
        const bool too_big = (size_t)wy_bwd_floats(p) * F > DN_CBACK_MAX_SHARED;
        if (cv == 16 || !(short_grid || too_big))
            break;
        cv /= 2;
    }
    /* grad's slices of the states: 32 columns where they divide svp and fit, else 16 */
    p->cs = p->svp % 32 == 0 ? 32 : 16;
    p->lds = p->cs + 4;
    if ((size_t)wy_grad_floats(p) * F > DN_CBACK_MAX_SHARED && p->cs == 32) {
        p->cs = 16;
        p->lds = p->cs + 4;
    }
    p->n_ch = (nt + DN_CHUNK - 1) / DN_CHUNK;
    p->chunks = nb * hv * p->n_ch;
    p->state_blocks = nb * hv * p->cblocks;
    p->direct = hv == hk;
    p->part_per_token = 2 * sk + 2;
    p->part_per_block = nt * p->part_per_token;
    const int64_t C = DN_CHUNK, n = p->chunks;
    p->off_vec = 0;
    p->off_ab = p->off_vec + n * 2 * C;
    p->off_p = p->off_ab + n * C * C;
    p->off_f = p->off_p + n * C * C;
    p->off_wk = p->off_f + n * C * C;
    p->off_g2 = p->off_wk + n * C * p->skp;
    p->off_u = p->off_g2 + n * C * p->skp;
    p->off_dr = p->off_u + n * C * p->svp;
    p->off_s0 = p->off_dr + n * C * p->svp;
    p->off_ds = p->off_s0 + n * p->skp * p->svp;
    p->off_part = p->off_ds + n * p->skp * p->svp;
    p->scratch_floats = p->off_part + (p->direct ? 0 : nb * hv * p->part_per_block);
    p->shared_prep = F * (size_t)wy_prep_floats(p);
    p->shared_fwd = F * (size_t)wy_fwd_floats(p);
    p->shared_bwd = F * (size_t)wy_bwd_floats(p);
    p->shared_grad = F * (size_t)wy_grad_floats(p);
    p->co = p->cob = p->out_blocks = p->ldx = p->ldy = 0;
    p->shared_out = 0;
    const size_t most = max64(max64((int64_t)p->shared_prep, (int64_t)p->shared_fwd),
                              max64((int64_t)p->shared_bwd, (int64_t)p->shared_grad));
    if (most > DN_CBACK_MAX_SHARED) {
        snprintf(reason, reason_size,
                 "S_k %lld, S_v %lld need %zu bytes of shared memory in the chunk-parallel "
                 "backward, over %u",
                 (long long)sk, (long long)sv, most, DN_CBACK_MAX_SHARED);
        return false;
    }
    if (p->chunks > 0x7fffffff || p->state_blocks > 0x7fffffff) {
        snprintf(reason, reason_size, "too many heads and sequences for one grid");
        return false;
    }
    return true;
}

/* out: X = [e^G Q | P] [C][ldx]; Y = [S0; U] [skp + C][ldy] */
static int64_t wy_out_floats(const struct dn_wy_plan *p)
{
    return DN_CHUNK * p->ldx + (p->skp + DN_CHUNK) * p->ldy + wy_tail();
}

bool cu_dn_wy_fwd_plan_init(struct dn_wy_plan *p, int64_t sk, int64_t sv, int64_t hk, int64_t hv,
                         int64_t nb, int64_t nt, char *reason, size_t reason_size)
{
    if (!cu_dn_wy_plan_init(p, sk, sv, hk, hv, nb, nt, reason, reason_size))
        return false;
    const int64_t C = DN_CHUNK, n = p->chunks;
    /* the forward's scratch: G and beta, P, Wk, U, S0 of every chunk */
    p->off_vec = 0;
    p->off_p = p->off_vec + n * 2 * C;
    p->off_wk = p->off_p + n * C * C;
    p->off_u = p->off_wk + n * C * p->skp;
    p->off_s0 = p->off_u + n * C * p->svp;
    p->scratch_floats = p->off_s0 + n * p->skp * p->svp;
    p->off_ab = p->off_f = p->off_g2 = p->off_dr = p->off_ds = p->off_part = -1;
    /* out's columns: 64 where they divide svp (two blocks an SM at S_k 128), narrowed while
     * its grid is short (a short prefill) */
    p->co = p->svp % 64 == 0 ? 64 : p->svp % 32 == 0 ? 32 : 16;
    while (p->co > 16 && n * ((sv + p->co - 1) / p->co) < DN_BACK_TARGET_BLOCKS)
        p->co /= 2;
    p->cob = (sv + p->co - 1) / p->co;
    p->out_blocks = n * p->cob;
    p->ldx = p->skp + C + 4;
    p->ldy = p->co + 4;
    p->shared_out = sizeof(float) * (size_t)wy_out_floats(p);
    if (p->shared_out > DN_CBACK_MAX_SHARED) {
        snprintf(reason, reason_size,
                 "S_k %lld needs %zu bytes of shared memory in the chunk-parallel forward, "
                 "over %u",
                 (long long)sk, p->shared_out, DN_CBACK_MAX_SHARED);
        return false;
    }
    if (p->out_blocks > 0x7fffffff) {
        snprintf(reason, reason_size, "too many heads and sequences for one grid");
        return false;
    }
    return true;
}

bool cu_dn_wy_fwd_auto(int64_t hv, int64_t nb, int64_t nt)
{
    return nt >= DN_WY_FWD_MIN_T && hv > 0 && nb > 0;
}
