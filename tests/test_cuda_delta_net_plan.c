/* test_cuda_delta_net_plan.c: the block split of the CUDA forward and backward of the gated
 * delta rule (src/backend/cuda/delta_net_plan.c), checked on the host: no GPU needed. The
 * kernels rely on what is checked here: whole warps, lane groups that do not straddle a warp
 * (the sums shuffle within one), every element of a chunk's S owned by exactly one thread,
 * every chunk starting inside S_v, a grid that fills an H200 for the Qwen3.5-0.8B shape,
 * the forward's rows a thread within its instantiated kernels, the backward's shared memory
 * within the limit for every S_k the forward takes, and scratch sized for the checkpoints
 * and partials; for the chunk-parallel kernels (delta_net_wy.cu), padded widths the
 * products can tile, scratch pieces in order and aligned, and the forward's plan the
 * backward's with its own scratch and out kernel. */
#include <string.h>

#include "backend/cuda/delta_net_plan.h"
#include "check.h"

static void check_fwd_plan(int64_t sk, int64_t sv, int64_t hv, int64_t nb)
{
    struct dn_fwd_plan p;
    char reason[160];
    const bool ok = cu_dn_fwd_plan_init(&p, sk, sv, hv, nb, reason, sizeof(reason));
    CHECK(ok, "forward S_k %lld S_v %lld H_v %lld B %lld: %s", (long long)sk, (long long)sv,
          (long long)hv, (long long)nb, reason);
    if (!ok)
        return;
    /* the launcher instantiates 1, 2, 4, 8 and 16 rows a thread */
    CHECK(p.rows == 1 || p.rows == 2 || p.rows == 4 || p.rows == 8 || p.rows == 16, "rows %lld",
          (long long)p.rows);
    CHECK(p.rows * DN_FWD_ROW_GROUPS >= sk && (p.rows == 1 || p.rows * DN_FWD_ROW_GROUPS < 2 * sk),
          "S_k %lld rows %lld", (long long)sk, (long long)p.rows);
    CHECK(p.chunks * DN_FWD_COLS >= sv && (p.chunks - 1) * DN_FWD_COLS < sv, "chunks %lld",
          (long long)p.chunks);
    CHECK(p.blocks == hv * nb * p.chunks);

    /* thread t = (jj, r) = (t / row_groups, t % row_groups) owns rows r + m row_groups,
     * m < rows, of column jj: every row of every column once, nothing past S_k kept */
    static unsigned char owned[256 * DN_FWD_COLS];
    memset(owned, 0, sizeof(owned));
    for (int64_t t = 0; t < DN_FWD_THREADS; t++)
        for (int64_t m = 0; m < p.rows; m++) {
            const int64_t i = t % DN_FWD_ROW_GROUPS + m * DN_FWD_ROW_GROUPS;
            if (i < sk)
                owned[i * DN_FWD_COLS + t / DN_FWD_ROW_GROUPS]++;
        }
    int64_t bad = 0;
    for (int64_t x = 0; x < sk * DN_FWD_COLS; x++)
        bad += owned[x] != 1;
    CHECK(bad == 0, "forward S_k %lld: %lld elements not owned once", (long long)sk,
          (long long)bad);
}

static void check_plan(int64_t sk, int64_t sv, int64_t hv, int64_t nb, int64_t nt)
{
    struct dn_back_plan p;
    char reason[160];
    const bool ok = cu_dn_back_plan_init(&p, sk, sv, hv, nb, nt, reason, sizeof(reason));
    CHECK(ok, "S_k %lld S_v %lld H_v %lld B %lld T %lld: %s", (long long)sk, (long long)sv,
          (long long)hv, (long long)nb, (long long)nt, reason);
    if (!ok)
        return;
    CHECK(p.cols == 8 || p.cols == 16 || p.cols == 32, "cols %lld", (long long)p.cols);
    CHECK(p.threads == p.cols * p.row_groups && p.threads % 32 == 0 && p.threads <= DN_BACK_THREADS,
          "threads %lld", (long long)p.threads);
    CHECK(32 % p.cols == 0); /* a column group lies inside one warp */
    CHECK(p.chunks * p.cols >= sv && (p.chunks - 1) * p.cols < sv, "chunks %lld",
          (long long)p.chunks);
    CHECK(p.blocks == hv * nb * p.chunks);
    CHECK(p.blocks >= DN_BACK_TARGET_BLOCKS || p.cols == 8, "blocks %lld with cols %lld",
          (long long)p.blocks, (long long)p.cols);
    CHECK(p.shared_bytes <= DN_BACK_MAX_SHARED &&
          p.shared_bytes == sizeof(float) * (size_t)(2 * sk * p.cols + 4 * sk + p.threads));
    CHECK(p.seg >= 1 && p.n_seg >= 1 &&
          (nt == 0 || (p.n_seg * p.seg >= nt && (p.n_seg - 1) * p.seg < nt)));
    CHECK(p.part_per_token == 2 * sk + 2 && p.part_per_block == nt * p.part_per_token);
    CHECK(p.work_per_block == (p.n_seg + p.seg) * sk * p.cols + p.seg * p.cols);

    /* thread t = (r, jj) owns rows r, r + row_groups, ... of column jj: once each */
    static unsigned char owned[1024 * 32];
    if (sk * p.cols <= (int64_t)sizeof(owned)) {
        memset(owned, 0, sizeof(owned));
        for (int64_t t = 0; t < p.threads; t++)
            for (int64_t i = t / p.cols; i < sk; i += p.row_groups)
                owned[i * p.cols + t % p.cols]++;
        int64_t bad = 0;
        for (int64_t x = 0; x < sk * p.cols; x++)
            bad += owned[x] != 1;
        CHECK(bad == 0, "%lld elements not owned once", (long long)bad);
    }
}

/* the chunked backward's plan: a column group of DN_CBACK_THREADS / cv lanes inside one
 * warp, product tiles that divide the padded dims, shared memory within the limit, a full
 * grid where the shape allows it, scratch for every chunk start */
static void check_cplan(int64_t sk, int64_t sv, int64_t hv, int64_t nb, int64_t nt)
{
    struct dn_cback_plan p;
    char reason[160];
    if (!cu_dn_cback_plan_init(&p, sk, sv, hv, nb, nt, reason, sizeof(reason))) {
        CHECK(strstr(reason, "shared memory") != NULL && sk > 128, "S_k %lld: %s",
              (long long)sk, reason);
        return;
    }
    CHECK(p.cv == 16 || p.cv == 32, "cv %lld", (long long)p.cv);
    const int64_t subs = DN_CBACK_THREADS / p.cv;
    CHECK(subs * p.cv == DN_CBACK_THREADS && 32 % subs == 0, "cv %lld", (long long)p.cv);
    CHECK(p.skp % 16 == 0 && p.skp >= sk && p.skp < sk + 16);
    /* tensor-core loads: leading dimensions of whole 16-byte groups */
    CHECK(p.ldk == p.skp + 4 && p.ldv == p.cv + 4 && p.ldc == DN_CHUNK + 4);
    CHECK(p.chunks * p.cv >= sv && (p.chunks - 1) * p.cv < sv && p.blocks == hv * nb * p.chunks);
    CHECK(p.blocks >= DN_BACK_TARGET_BLOCKS || p.cv == 16, "blocks %lld", (long long)p.blocks);
    CHECK(p.n_ch * DN_CHUNK >= nt && (p.n_ch == 0 || (p.n_ch - 1) * DN_CHUNK < nt));
    CHECK(p.shared_bytes <= DN_CBACK_MAX_SHARED && p.shared_bytes % 32 == 0);
    CHECK(p.part_per_token == 2 * sk + 2 && p.part_per_block == nt * p.part_per_token &&
          p.ckpt_per_block == p.n_ch * p.skp * p.cv);
}

/* the chunk-parallel backward's plan (delta_net_wy.cu): padded widths its products can
 * tile, slices that divide the padded S_v, scratch pieces 32-byte aligned and in order,
 * every kernel's shared memory within the limit and 32-byte aligned buffers; refused only
 * past S_k 128 (grad's dq and dk tiles) or S_v 128 (shared memory) */
static void check_wyplan(int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t nb, int64_t nt)
{
    struct dn_wy_plan p;
    char reason[160];
    if (!cu_dn_wy_plan_init(&p, sk, sv, hk, hv, nb, nt, reason, sizeof(reason))) {
        CHECK((strstr(reason, "shared memory") != NULL || strstr(reason, "past the") != NULL) &&
                  (sk > 128 || sv > 128),
              "S_k %lld S_v %lld: %s", (long long)sk, (long long)sv, reason);
        return;
    }
    CHECK(p.cv == 16 || p.cv == 32 || p.cv == 64, "cv %lld", (long long)p.cv);
    CHECK(p.skp % 16 == 0 && p.skp >= sk && p.skp < sk + 16);
    CHECK(p.svp % p.cv == 0 && p.svp >= sv && p.svp < sv + p.cv && p.cblocks * p.cv == p.svp);
    CHECK((p.cs == 16 || p.cs == 32) && p.svp % p.cs == 0, "cs %lld svp %lld", (long long)p.cs,
          (long long)p.svp);
    CHECK(p.ldk == p.skp + 4 && p.ldv == p.cv + 4 && p.ldw == p.svp + 4 && p.lds == p.cs + 4 &&
          p.ldc == DN_CHUNK + 4);
    CHECK(p.n_ch * DN_CHUNK >= nt && (p.n_ch == 0 || (p.n_ch - 1) * DN_CHUNK < nt));
    CHECK(p.chunks == nb * hv * p.n_ch && p.state_blocks == nb * hv * p.cblocks);
    /* columns narrowed only for a short grid (up to S_k 128, bwd fits at 64 columns) */
    const int64_t wider = 2 * p.cv;
    CHECK(p.cv == DN_WY_MAX_CV || nb * hv * ((sv + wider - 1) / wider) < DN_WY_TARGET_BLOCKS,
          "state blocks %lld cv %lld", (long long)p.state_blocks, (long long)p.cv);
    CHECK(p.direct == (hv == hk));
    CHECK(p.part_per_token == 2 * sk + 2 && p.part_per_block == nt * p.part_per_token);
    const int64_t C = DN_CHUNK, n = p.chunks;
    const int64_t offs[] = {p.off_vec, p.off_ab, p.off_p,  p.off_f,  p.off_wk, p.off_g2,
                            p.off_u,   p.off_dr, p.off_s0, p.off_ds, p.off_part};
    const int64_t sizes[] = {n * 2 * C,         n * C * C,         n * C * C,
                             n * C * C,         n * C * p.skp,     n * C * p.skp,
                             n * C * p.svp,     n * C * p.svp,     n * p.skp * p.svp,
                             n * p.skp * p.svp, p.direct ? 0 : nb * hv * p.part_per_block};
    CHECK(p.off_vec == 0);
    for (int i = 0; i < 11; i++) {
        CHECK(offs[i] % 8 == 0, "scratch piece %d at %lld", i, (long long)offs[i]);
        const int64_t end = i + 1 < 11 ? offs[i + 1] : p.scratch_floats;
        CHECK(end == offs[i] + sizes[i], "scratch piece %d", i);
    }
    const size_t shared[] = {p.shared_prep, p.shared_fwd, p.shared_bwd, p.shared_grad};
    for (int i = 0; i < 4; i++)
        CHECK(shared[i] <= DN_CBACK_MAX_SHARED && shared[i] % 32 == 0, "kernel %d: %zu bytes", i,
              shared[i]);
    /* every buffer of every kernel starts 32 bytes aligned: the widths times the heights
     * are multiples of 8 floats */
    CHECK(p.skp * p.ldv % 8 == 0 && p.skp * p.lds % 8 == 0 && C * p.ldw % 8 == 0 &&
          C * p.ldk % 8 == 0 && C * p.ldv % 8 == 0 && C * p.lds % 8 == 0 && C * p.ldc % 8 == 0);
}

/* the chunk-parallel forward's plan (cu_dn_wy_fwd_plan_init): the backward's choices (cv, pads,
 * chunks), the forward's scratch pieces alone, in order and 32-byte aligned, the backward's
 * pieces marked absent; out's columns dividing svp, covering S_v with every block starting
 * inside it, its reads of a chunk's S0 and U rows inside svp, its grid narrowed only when
 * short, its shared memory within the limit and its buffers aligned */
static void check_wyfplan(int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t nb, int64_t nt)
{
    struct dn_wy_plan f, w;
    char reason[160];
    const bool ok = cu_dn_wy_fwd_plan_init(&f, sk, sv, hk, hv, nb, nt, reason, sizeof(reason));
    const bool back_ok = cu_dn_wy_plan_init(&w, sk, sv, hk, hv, nb, nt, reason, sizeof(reason));
    CHECK(ok == back_ok, "S_k %lld S_v %lld: forward %d backward %d", (long long)sk,
          (long long)sv, (int)ok, (int)back_ok);
    if (!ok || !back_ok)
        return;
    CHECK(f.cv == w.cv && f.svp == w.svp && f.skp == w.skp && f.cblocks == w.cblocks &&
          f.n_ch == w.n_ch && f.chunks == w.chunks && f.state_blocks == w.state_blocks &&
          f.ldk == w.ldk && f.ldv == w.ldv && f.ldw == w.ldw && f.ldc == w.ldc &&
          f.shared_prep == w.shared_prep && f.shared_fwd == w.shared_fwd);
    CHECK(w.co == 0 && w.out_blocks == 0 && w.shared_out == 0); /* a backward's plan */
    const int64_t C = DN_CHUNK, n = f.chunks;
    const int64_t offs[] = {f.off_vec, f.off_p, f.off_wk, f.off_u, f.off_s0};
    const int64_t sizes[] = {n * 2 * C, n * C * C, n * C * f.skp, n * C * f.svp,
                             n * f.skp * f.svp};
    CHECK(f.off_vec == 0);
    for (int i = 0; i < 5; i++) {
        CHECK(offs[i] % 8 == 0, "forward scratch piece %d at %lld", i, (long long)offs[i]);
        const int64_t end = i + 1 < 5 ? offs[i + 1] : f.scratch_floats;
        CHECK(end == offs[i] + sizes[i], "forward scratch piece %d", i);
    }
    CHECK(f.off_ab == -1 && f.off_f == -1 && f.off_g2 == -1 && f.off_dr == -1 && f.off_ds == -1 &&
          f.off_part == -1);
    CHECK(f.scratch_floats <= w.scratch_floats);
    CHECK((f.co == 16 || f.co == 32 || f.co == 64) && f.svp % f.co == 0, "co %lld svp %lld",
          (long long)f.co, (long long)f.svp);
    CHECK(f.cob * f.co >= sv && (f.cob - 1) * f.co < sv && f.cob * f.co <= f.svp,
          "cob %lld co %lld", (long long)f.cob, (long long)f.co);
    CHECK(f.out_blocks == n * f.cob);
    const int64_t widest = f.svp % 64 == 0 ? 64 : f.svp % 32 == 0 ? 32 : 16;
    CHECK(f.co == widest || n * ((sv + 2 * f.co - 1) / (2 * f.co)) < DN_BACK_TARGET_BLOCKS,
          "co %lld narrowed with %lld chunks", (long long)f.co, (long long)n);
    CHECK(f.ldx == f.skp + C + 4 && f.ldy == f.co + 4 && f.ldx % 4 == 0);
    CHECK(f.shared_out <= DN_CBACK_MAX_SHARED && f.shared_out % 32 == 0 &&
              f.shared_out ==
                  sizeof(float) * (size_t)(C * f.ldx + (f.skp + C) * f.ldy + DN_WY_VECS * C),
          "out: %zu bytes", f.shared_out);
    /* X, then Y, then the vectors start 32 bytes aligned; P's columns in X too */
    CHECK(C * f.ldx % 8 == 0 && (f.skp + C) * f.ldy % 8 == 0 && f.skp % 8 == 0);
}

int main(void)
{
    /* the chunked backward on Qwen3.5-0.8B's DeltaNet layers: 16 x 512 tokens take 1024
     * blocks of 32 columns, one sequence 128 blocks of 16 */
    struct dn_cback_plan cp;
    char creason[160];
    CHECK(cu_dn_cback_plan_init(&cp, 128, 128, 16, 16, 512, creason, sizeof(creason)), "%s", creason);
    CHECK(cp.cv == 32 && cp.blocks == 1024 && cp.n_ch == 8, "cv %lld blocks %lld",
          (long long)cp.cv, (long long)cp.blocks);
    CHECK(cu_dn_cback_plan_init(&cp, 128, 128, 16, 1, 512, creason, sizeof(creason)), "%s", creason);
    CHECK(cp.cv == 16 && cp.blocks == 128, "cv %lld blocks %lld", (long long)cp.cv,
          (long long)cp.blocks);
    static const int64_t csks[] = {1, 3, 4, 16, 20, 33, 64, 100, 128, 129, 255, 256};
    static const int64_t csvs[] = {1, 7, 12, 32, 40, 65, 128, 1000};
    for (size_t a = 0; a < sizeof(csks) / sizeof(csks[0]); a++)
        for (size_t b = 0; b < sizeof(csvs) / sizeof(csvs[0]); b++)
            check_cplan(csks[a], csvs[b], 1 + (int64_t)(a + b) % 16, 1 + (int64_t)b % 3,
                        (int64_t)(a * 97 + b * 13));

    /* the chunk-parallel backward on Qwen3.5-0.8B's training shape (16 x 512 tokens, 16
     * heads of 128): 2048 chunk blocks, 512 state blocks of 64 columns, slices of 32, and
     * the scratch the file comment of delta_net_wy.cu states (~639 MB) */
    struct dn_wy_plan wp;
    char wreason[160];
    CHECK(cu_dn_wy_plan_init(&wp, 128, 128, 16, 16, 16, 512, wreason, sizeof(wreason)), "%s",
          wreason);
    CHECK(wp.cv == 64 && wp.cs == 32 && wp.chunks == 2048 && wp.state_blocks == 512 &&
              wp.n_ch == 8 && wp.direct && wp.skp == 128 && wp.svp == 128,
          "cv %lld cs %lld chunks %lld state blocks %lld", (long long)wp.cv, (long long)wp.cs,
          (long long)wp.chunks, (long long)wp.state_blocks);
    CHECK(wp.scratch_floats == 142868480 + 2048 * 64 * 128, "scratch %lld floats",
          (long long)wp.scratch_floats);
    /* one sequence of 16 heads keeps 64 columns (32 blocks: the BF16 walk); 4 heads narrow
     * to 16 columns for a grid of 32 */
    CHECK(cu_dn_wy_plan_init(&wp, 128, 128, 16, 16, 1, 512, wreason, sizeof(wreason)), "%s",
          wreason);
    CHECK(wp.cv == 64 && wp.state_blocks == 32, "cv %lld", (long long)wp.cv);
    CHECK(cu_dn_wy_plan_init(&wp, 128, 128, 4, 4, 1, 512, wreason, sizeof(wreason)), "%s", wreason);
    CHECK(wp.cv == 16 && wp.state_blocks == 32, "cv %lld", (long long)wp.cv);
    /* grouped heads keep partials for the reduction */
    CHECK(cu_dn_wy_plan_init(&wp, 128, 128, 8, 16, 16, 512, wreason, sizeof(wreason)), "%s",
          wreason);
    CHECK(!wp.direct && wp.scratch_floats == wp.off_part + 16 * 16 * 512 * (2 * 128 + 2));
    /* S_k 256 is refused, with why (the chunked or the per-token kernel takes it) */
    wreason[0] = 0;
    CHECK(!cu_dn_wy_plan_init(&wp, 256, 128, 16, 16, 16, 512, wreason, sizeof(wreason)));
    CHECK(strstr(wreason, "S_k 256 is past") != NULL, "%s", wreason);
    static const int64_t wsks[] = {1, 3, 16, 20, 33, 64, 100, 128, 129, 256};
    static const int64_t wsvs[] = {1, 7, 12, 32, 40, 65, 128, 129};
    for (size_t a = 0; a < sizeof(wsks) / sizeof(wsks[0]); a++)
        for (size_t b = 0; b < sizeof(wsvs) / sizeof(wsvs[0]); b++) {
            const int64_t hk = 1 + (int64_t)(a + b) % 4, hv = hk * (1 + (int64_t)b % 3);
            check_wyplan(wsks[a], wsvs[b], hk, hv, 1 + (int64_t)a % 3, (int64_t)(a * 97 + b * 13));
        }
    check_wyplan(16, 12, 2, 4, 2, 5); /* the conformance suite's shapes */
    check_wyplan(128, 128, 2, 4, 2, 150);
    check_wyplan(128, 128, 16, 16, 16, 512);
    check_wyplan(128, 128, 16, 16, 0, 512); /* no sequences: nothing launched */
    check_wyplan(128, 128, 16, 16, 2, 0);   /* no tokens: the state pass alone */
    for (int64_t s = 1; s <= 128; s += 9) /* every S up to 128 fits */
        CHECK(cu_dn_wy_plan_init(&wp, s, s, 2, 4, 2, 100, wreason, sizeof(wreason)), "S %lld: %s",
              (long long)s, wreason);
    CHECK(cu_dn_wy_plan_init(&wp, 128, 128, 2, 4, 2, 100, wreason, sizeof(wreason)), "%s", wreason);

    /* the chunk-parallel forward on the training shape: the backward's 2048 chunks and 512
     * state blocks, out in blocks of 64 columns (4096, two an SM: ~111 KiB each), scratch
     * for G and beta, P, Wk, U and S0 alone (~303 MB against the backward's ~639) */
    CHECK(cu_dn_wy_fwd_plan_init(&wp, 128, 128, 16, 16, 16, 512, wreason, sizeof(wreason)), "%s",
          wreason);
    CHECK(wp.cv == 64 && wp.co == 64 && wp.cob == 2 && wp.out_blocks == 4096 &&
              wp.chunks == 2048 && wp.state_blocks == 512,
          "cv %lld co %lld out blocks %lld", (long long)wp.cv, (long long)wp.co,
          (long long)wp.out_blocks);
    CHECK(wp.scratch_floats == 2048LL * (2 * 64 + 64 * 64 + 64 * 128 + 64 * 128 + 128 * 128),
          "forward scratch %lld floats", (long long)wp.scratch_floats);
    CHECK(2 * (wp.shared_out + 1024) <= 228u << 10, "out: %zu bytes", wp.shared_out);
    /* a one-sequence prefill of 64 tokens: 16 chunks, out narrowed to 16 columns (128
     * blocks), the state walk at 64 columns (32 blocks) */
    CHECK(cu_dn_wy_fwd_plan_init(&wp, 128, 128, 16, 16, 1, 64, wreason, sizeof(wreason)), "%s",
          wreason);
    CHECK(wp.co == 16 && wp.out_blocks == 128 && wp.cv == 64, "co %lld out blocks %lld",
          (long long)wp.co, (long long)wp.out_blocks);
    /* no tokens: no chunks, no scratch, fwd alone copies the state */
    CHECK(cu_dn_wy_fwd_plan_init(&wp, 128, 128, 2, 4, 2, 0, wreason, sizeof(wreason)), "%s", wreason);
    CHECK(wp.chunks == 0 && wp.out_blocks == 0 && wp.scratch_floats == 0 && wp.state_blocks > 0);
    /* S_k 256 is refused as the backward's plan is (the per-token kernel takes it) */
    wreason[0] = 0;
    CHECK(!cu_dn_wy_fwd_plan_init(&wp, 256, 128, 16, 16, 16, 512, wreason, sizeof(wreason)));
    CHECK(strstr(wreason, "S_k 256 is past") != NULL, "%s", wreason);
    for (size_t a = 0; a < sizeof(wsks) / sizeof(wsks[0]); a++)
        for (size_t b = 0; b < sizeof(wsvs) / sizeof(wsvs[0]); b++) {
            const int64_t hk = 1 + (int64_t)(a + b) % 4, hv = hk * (1 + (int64_t)b % 3);
            check_wyfplan(wsks[a], wsvs[b], hk, hv, 1 + (int64_t)a % 3,
                          (int64_t)(a * 97 + b * 13));
        }
    /* AUTO's choice: decode and prefills under a chunk stay per token; from 64 tokens every
     * batch goes by chunks, a one-sequence prefill of 16 heads included */
    CHECK(!cu_dn_wy_fwd_auto(16, 1, 1) && !cu_dn_wy_fwd_auto(16, 16, 1) && !cu_dn_wy_fwd_auto(16, 16, 63));
    CHECK(!cu_dn_wy_fwd_auto(16, 1, 63) && cu_dn_wy_fwd_auto(16, 1, 64) &&
          cu_dn_wy_fwd_auto(16, 1, 512));
    CHECK(cu_dn_wy_fwd_auto(16, 16, 64) && cu_dn_wy_fwd_auto(16, 16, 512) && cu_dn_wy_fwd_auto(16, 8, 64));
    CHECK(cu_dn_wy_fwd_auto(16, 4, 2048) && cu_dn_wy_fwd_auto(16, 7, 512));
    CHECK(cu_dn_wy_fwd_auto(16, 1, 449) && cu_dn_wy_fwd_auto(16, 1, 4096) &&
          cu_dn_wy_fwd_auto(16, 3, 4096));
    CHECK(!cu_dn_wy_fwd_auto(64, 2, 63) && cu_dn_wy_fwd_auto(64, 2, 64) &&
          cu_dn_wy_fwd_auto(32, 2, 64));
    CHECK(!cu_dn_wy_fwd_auto(0, 2, 64) && !cu_dn_wy_fwd_auto(16, 0, 64));
    CHECK(!cu_dn_wy_fwd_auto(1000, 1000, 0));
    /* the conformance suite's forward shapes */
    static const int64_t fts[] = {0, 1, 5, 63, 64, 65, 150, 512, 2048};
    for (size_t t = 0; t < sizeof(fts) / sizeof(fts[0]); t++) {
        check_wyfplan(16, 12, 2, 4, 2, fts[t]);
        check_wyfplan(16, 12, 1, 3, 2, fts[t]);
        check_wyfplan(20, 40, 1, 2, 2, fts[t]);
        check_wyfplan(128, 128, 2, 4, 2, fts[t]);
        check_wyfplan(128, 128, 1, 2, 1, fts[t]);
        check_wyfplan(16, 12, 32, 64, 2, fts[t]);
        check_wyfplan(128, 128, 16, 32, 2, fts[t]);
    }
    check_wyfplan(128, 128, 16, 16, 16, 512);
    check_wyfplan(128, 128, 16, 16, 0, 512);
    for (int64_t s = 1; s <= 128; s += 9)
        check_wyfplan(s, s, 2, 4, 2, 100);

    /* forward: a column's lanes are a power-of-two group inside one warp; whole warps */
    CHECK(32 % DN_FWD_ROW_GROUPS == 0 && DN_FWD_THREADS % 32 == 0 &&
          DN_FWD_COLS * DN_FWD_ROW_GROUPS == DN_FWD_THREADS);
    CHECK(DN_FWD_ROW_GROUPS * DN_FWD_MAX_ROWS >= 256); /* the backward's plans below go there */
    /* Qwen3.5-0.8B's DeltaNet layers: 8 rows a thread, 1024 warps (the old kernel: 64) */
    struct dn_fwd_plan fp;
    char freason[160];
    CHECK(cu_dn_fwd_plan_init(&fp, 128, 128, 16, 1, freason, sizeof(freason)), "%s", freason);
    CHECK(fp.rows == 8 && fp.chunks == 16 && fp.blocks == 256 &&
              fp.blocks * DN_FWD_THREADS / 32 == 1024,
          "rows %lld chunks %lld blocks %lld", (long long)fp.rows, (long long)fp.chunks,
          (long long)fp.blocks);
    static const int64_t fsks[] = {1, 3, 15, 16, 17, 33, 64, 100, 128, 129, 255, 256};
    static const int64_t fsvs[] = {1, 7, 8, 12, 65, 128, 1000};
    for (size_t a = 0; a < sizeof(fsks) / sizeof(fsks[0]); a++)
        for (size_t b = 0; b < sizeof(fsvs) / sizeof(fsvs[0]); b++)
            check_fwd_plan(fsks[a], fsvs[b], 1 + (int64_t)(a + b) % 16, 1 + (int64_t)b % 3);
    check_fwd_plan(16, 12, 4, 2); /* the conformance suite's shapes */
    check_fwd_plan(128, 128, 4, 1);
    /* a batch of none: no blocks, nothing launched */
    CHECK(cu_dn_fwd_plan_init(&fp, 128, 128, 16, 0, freason, sizeof(freason)) && fp.blocks == 0);
    /* S_k past 256 rows does not fit the registers: refused, with why */
    freason[0] = 0;
    CHECK(!cu_dn_fwd_plan_init(&fp, 257, 128, 16, 1, freason, sizeof(freason)));
    CHECK(strstr(freason, "S_k 257") != NULL, "%s", freason);

    /* Qwen3.5-0.8B's DeltaNet layers, a 256-token window: 128 blocks of 16 columns */
    struct dn_back_plan p;
    char reason[160];
    CHECK(cu_dn_back_plan_init(&p, 128, 128, 16, 1, 256, reason, sizeof(reason)), "%s", reason);
    CHECK(p.cols == 16 && p.blocks == 128 && p.threads == 256 && p.row_groups == 16,
          "cols %lld blocks %lld threads %lld", (long long)p.cols, (long long)p.blocks,
          (long long)p.threads);
    CHECK(p.seg == 16 && p.n_seg == 16);
    /* a batch of 4 of it keeps chunks of 32 */
    CHECK(cu_dn_back_plan_init(&p, 128, 128, 16, 4, 256, reason, sizeof(reason)), "%s", reason);
    CHECK(p.cols == 32 && p.blocks == 256 && p.row_groups == 8);

    /* the conformance suite's shapes, and a spread of others up to the forward's S_k 256 */
    check_plan(16, 12, 4, 2, 5);
    check_plan(16, 12, 3, 2, 1);
    check_plan(128, 128, 4, 1, 40);
    check_plan(1, 1, 1, 1, 1);
    check_plan(128, 128, 16, 1, 0);
    static const int64_t sks[] = {1, 3, 16, 33, 64, 100, 128, 255, 256};
    static const int64_t svs[] = {1, 7, 12, 32, 65, 128, 256, 1000};
    static const int64_t hvs[] = {1, 3, 16, 48};
    for (size_t a = 0; a < sizeof(sks) / sizeof(sks[0]); a++)
        for (size_t b = 0; b < sizeof(svs) / sizeof(svs[0]); b++)
            for (size_t h = 0; h < sizeof(hvs) / sizeof(hvs[0]); h++)
                check_plan(sks[a], svs[b], hvs[h], 1 + (int64_t)h % 2, 1 + (int64_t)(a * 37 + b));

    /* S_k too large for S and dS in shared memory, even at 8 columns: refused, with why */
    reason[0] = 0;
    CHECK(!cu_dn_back_plan_init(&p, 8192, 128, 16, 1, 16, reason, sizeof(reason)));
    CHECK(strstr(reason, "shared memory") != NULL, "%s", reason);
    return check_summary();
}
