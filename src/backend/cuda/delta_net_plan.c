/* delta_net_plan.c: the block split of the CUDA forward and backward of the gated delta
 * rule (see delta_net_plan.h). Compiled in every build: it needs no CUDA. */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/delta_net_plan.h"

bool dn_fwd_plan_init(struct dn_fwd_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
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

bool dn_back_plan_init(struct dn_back_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
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
 * 16 x 16 tile a warp */
static int64_t cback_shared_floats(int64_t skp, int64_t cv)
{
    const int64_t ldk = skp + 4, ldv = cv + 4, ldc = DN_CHUNK + 4;
    return 2 * DN_CHUNK * ldk + 2 * skp * ldv + 5 * DN_CHUNK * ldv + 3 * DN_CHUNK * ldc +
           8 * DN_CHUNK + DN_CBACK_THREADS / 32 * 256;
}

bool dn_cback_plan_init(struct dn_cback_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
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
