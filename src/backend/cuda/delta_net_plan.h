/* delta_net_plan.h (internal, C and C++): how the CUDA forward and backward of the gated
 * delta rule (DELTA_NET, DELTA_NET_BACK, src/backend/cuda/delta_net.cu) split one problem
 * over blocks, worked out on the host from the shape alone. Plain C so that a test without
 * a GPU can check it, and so that the precondition (which must not touch the device) and
 * the launcher read the same numbers.
 *
 * Both split the value columns of each (value head, sequence) and give every column several
 * threads, each owning the key rows r, r + row_groups, ... So a thread owns the same
 * elements of S (and dS) for the whole recurrence, and only dot products cross threads.
 * A plan does not depend on the device (the same shape always sums in the same order).
 *
 * Forward: a block of DN_FWD_THREADS threads takes DN_FWD_COLS columns, each walked by the
 * DN_FWD_ROW_GROUPS lanes of one half warp, which keep their rows of S in registers (`rows`
 * of them, the kernel's template parameter). Backward: a block takes one column chunk of
 * `cols` columns walked by `row_groups` threads each, with S and dS in shared memory. */
#ifndef LATHE_BACKEND_CUDA_DELTA_NET_PLAN_H
#define LATHE_BACKEND_CUDA_DELTA_NET_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DN_FWD_ROW_GROUPS 16 /* forward: lanes a column, aligned in a warp (a power of two) */
#define DN_FWD_THREADS 128   /* forward: threads a block */
#define DN_FWD_COLS (DN_FWD_THREADS / DN_FWD_ROW_GROUPS) /* forward: columns a block */
#define DN_FWD_MAX_ROWS 16 /* forward: key rows a thread keeps in registers; S_k <= 256 */

struct dn_fwd_plan {
    int64_t rows;   /* key rows a thread: the least power of two >= S_k / DN_FWD_ROW_GROUPS */
    int64_t chunks; /* column chunks of a value head: ceil(S_v / DN_FWD_COLS) */
    int64_t blocks; /* H_v * B * chunks; block (c, h, b) is (b * H_v + h) * chunks + c */
};

/* The forward's plan for S_k, S_v, H_v value heads and B sequences. False, with a reason,
 * when the kernel cannot run it (S_k over DN_FWD_ROW_GROUPS * DN_FWD_MAX_ROWS, too many
 * blocks). */
bool cu_dn_fwd_plan_init(struct dn_fwd_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                      char *reason, size_t reason_size);

#define DN_BACK_THREADS 256             /* the most threads a block */
#define DN_BACK_TARGET_BLOCKS 128       /* narrow the chunks until there are this many */
#define DN_BACK_MAX_SHARED (200u << 10) /* of Hopper's 227 KiB a block may opt into */

struct dn_back_plan {
    int64_t cols;           /* value columns a block: 8, 16 or 32 (a power of two <= a warp) */
    int64_t chunks;         /* column chunks of a value head: ceil(S_v / cols) */
    int64_t row_groups;     /* threads a column (a power of two) */
    int64_t threads;        /* cols * row_groups: a multiple of 32, at most DN_BACK_THREADS */
    int64_t blocks;         /* H_v * B * chunks; block (c, h, b) is (b * H_v + h) * chunks + c */
    int64_t seg, n_seg;     /* a checkpoint every seg tokens, n_seg of them */
    int64_t part_per_token; /* floats of partial sums a token: dq [S_k], dk [S_k], dg, dbeta */
    int64_t part_per_block; /* T * part_per_token */
    int64_t work_per_block; /* floats: checkpoints [n_seg][S_k][cols], one segment's states
                               [seg][S_k][cols], its e values [seg][cols] */
    size_t shared_bytes;    /* S, dS [S_k][cols]; q, k, dq, dk rows [S_k]; [row_groups][cols] */
};

/* The plan for S_k, S_v, H_v value heads, B sequences and T tokens. False, with a reason,
 * when the kernel cannot run it (shared memory over DN_BACK_MAX_SHARED, too many blocks). */
bool cu_dn_back_plan_init(struct dn_back_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                       int64_t nt, char *reason, size_t reason_size);


/* The chunked backward (delta_net.cu; the algebra is src/ops/delta_net.c's chunked CPU
 * backward): a block of DN_CBACK_THREADS threads takes `cv` value columns of one (value
 * head, sequence) and walks the tokens in chunks of DN_CHUNK, keeping one chunk's keys,
 * queries, state, state gradient and chunk matrices in shared memory, and runs the chunk's
 * products on tensor cores (16 x 16 tiles, k steps of 8). So S_k is padded to skp, a
 * multiple of 16, cv is 16 or 32, and the leading dimensions (ldk, ldv, ldc) are 4 past
 * the widths: multiples of 4 floats, as the tensor-core loads need, that shift each row by
 * 4 banks. */
#define DN_CHUNK 64
#define DN_CBACK_THREADS 256                  /* 4 lanes a chunk row in the row sums */
#define DN_CBACK_MAX_SHARED (226u << 10)      /* of Hopper's 227 KiB a block may opt into */

struct dn_cback_plan {
    int64_t cv;             /* value columns a block: 32 or 16 */
    int64_t chunks;         /* column chunks of a value head: ceil(S_v / cv) */
    int64_t blocks;         /* H_v * B * chunks; block (c, h, b) is (b * H_v + h) * chunks + c */
    int64_t skp;            /* S_k rounded up to a multiple of 16 */
    int64_t n_ch;           /* token chunks: ceil(T / DN_CHUNK) */
    int64_t ldk, ldv, ldc;  /* skp + 4, cv + 4, DN_CHUNK + 4 */
    int64_t part_per_token; /* as dn_back_plan: dq [S_k], dk [S_k], dg, dbeta */
    int64_t part_per_block; /* T * part_per_token */
    int64_t ckpt_per_block; /* floats: the state at every chunk start, [n_ch][skp][cv] */
    size_t shared_bytes;
};

/* The chunked backward's plan for S_k, S_v, H_v value heads, B sequences and T tokens.
 * False, with a reason, when its shared memory would pass DN_CBACK_MAX_SHARED even at
 * 16 columns a block, or the grid is too large; the launcher then takes the per-token kernel. */
bool cu_dn_cback_plan_init(struct dn_cback_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                        int64_t nt, char *reason, size_t reason_size);

/* The chunk-parallel backward (delta_net_wy.cu), the default for DELTA_NET_BACK: four
 * kernels over chunks of DN_CHUNK tokens, in the order they run:
 *   prep  one block a chunk (sequence, value head, chunk): the chunk's gates, K K^T and
 *         Q K^T gated and masked (Ab, P), T = (I + diag(beta) Ab)^-1, the WY form
 *         Uv = T diag(beta) V, Wk = T diag(beta e^G) K, and for bwd F = T^T P^T,
 *         G2 = T^T diag(e^{G_last - G}) K, all into scratch;
 *   fwd   one block a (sequence, value head, cv value columns), walking the chunks in
 *         order: the state at each chunk start (scratch), U = Uv - Wk S0 (in Uv's place);
 *   bwd   the same blocks walking back: the state gradient at each chunk end (scratch),
 *         dR = F Do + G2 dS (scratch), and the result's dstate;
 *   grad  one block a chunk again: dq, dk, dv, dg, dbeta of the chunk from the above,
 *         written straight into the result when H_v = H_k, else as partials that
 *         delta_net.cu's reduction adds over the value heads of a key head.
 * So S_k is padded to skp (a multiple of 16) and S_v to svp (a multiple of cv); the
 * scratch arrays hold padded rows (zeros past S_k and S_v). Leading dimensions in shared
 * memory are 4 past the widths (see dn_cback_plan). */
#define DN_WY_THREADS 512 /* every kernel: 16 warps, 8 lanes a chunk row in the row sums */
#define DN_WY_MAX_CV 64   /* value columns a block of the state passes, at most */
/* The state passes narrow their columns (64, 32, 16) only while their grid is short of this
 * many blocks. It was DN_BACK_TARGET_BLOCKS (128), which narrowed one sequence of 16 heads
 * of 128 to 16 columns (128 blocks) and so off the BF16 walk: H100, bench_delta_net, 1 x 512
 * tokens, BF16, forward 0.140 ms at 16 columns against 0.098 at 64, backward 0.335 against
 * 0.212 (1 x 2048: 0.495 against 0.339, 1.186 against 0.759; TF32 and F32 faster at 64 as
 * well, 32 columns slower than both); `lathe bench` of the 0.8B BF16 file pp512 64.6k
 * against 71.5k, pp2048 89.1k against 103.4k, the same greedy text (1ebe46f,
 * LATHE_DN_MIN_CV). A walk is sequential over the chunks, so its time is the chunks' count
 * times a step's latency; a wider block's step costs about what a narrow one's does. */
#define DN_WY_TARGET_BLOCKS 32
#define DN_WY_VECS 12     /* vectors of DN_CHUNK floats a block keeps in shared memory */

struct dn_wy_plan {
    int64_t skp, svp;            /* S_k rounded up to 16, S_v rounded up to cv */
    int64_t cv, cblocks;         /* state passes: columns a block (16, 32, 64), svp / cv */
    int64_t cs;                  /* grad: the states' columns a slice (16 or 32) */
    int64_t n_ch;                /* token chunks a sequence: ceil(T / DN_CHUNK) */
    int64_t chunks;              /* B * H_v * n_ch: chunk (b, h, c) is (b * H_v + h) * n_ch + c */
    int64_t state_blocks;        /* B * H_v * cblocks: block (b, h, c) is (b * H_v + h) *
                                    cblocks + c */
    int64_t ldk, ldv, ldw, lds, ldc; /* skp + 4, cv + 4, svp + 4, cs + 4, DN_CHUNK + 4 */
    bool direct;                 /* H_v == H_k: grad writes dq, dk, dg, dbeta itself */
    int64_t part_per_token;      /* !direct: dq [S_k], dk [S_k], dg, dbeta a token */
    int64_t part_per_block;      /* !direct: T * part_per_token a (value head, sequence) */
    /* scratch, in floats from its start: per chunk G and beta [2][C]; Ab, P, F [C][C];
     * Wk, G2 [C][skp]; U [C][svp]; dR [C][svp]; S0 and dS [skp][svp]; then the partials
     * [B][H_v][T][part_per_token] unless direct */
    int64_t off_vec, off_ab, off_p, off_f, off_wk, off_g2, off_u, off_dr, off_s0, off_ds,
        off_part;
    int64_t scratch_floats;
    size_t shared_prep, shared_fwd, shared_bwd, shared_grad; /* bytes of each kernel */
    /* the forward's out kernel (cu_dn_wy_fwd_plan_init sets these; 0 in a backward's plan) */
    int64_t co;         /* out: value columns a block (16, 32 or 64, dividing svp) */
    int64_t cob;        /* out: column blocks a chunk, ceil(S_v / co) */
    int64_t out_blocks; /* chunks * cob: block (chunk ci, columns c) is ci * cob + c */
    int64_t ldx, ldy;   /* out: skp + DN_CHUNK + 4 ([e^G Q | P] rows), co + 4 ([S0; U] rows) */
    size_t shared_out;
};

/* The chunk-parallel backward's plan for S_k, S_v, H_k key and H_v value heads, B
 * sequences and T tokens. False, with a reason, when a kernel's shared memory would pass
 * DN_CBACK_MAX_SHARED (S_k or S_v past 128: the launcher then takes the chunked kernel
 * above, then the per-token one) or a grid is too large. */
bool cu_dn_wy_plan_init(struct dn_wy_plan *p, int64_t sk, int64_t sv, int64_t hk, int64_t hv,
                     int64_t nb, int64_t nt, char *reason, size_t reason_size);

/* The chunk-parallel forward (DELTA_NET, delta_net_wy.cu) from the same pieces, three
 * kernels:
 *   prep  as the backward's, less what only bwd and grad read (Ab, F, G2 stay unwritten):
 *         G and beta, P, Uv and Wk into scratch;
 *   fwd   as the backward's, and at the end of its walk the final state into DELTA_NET's
 *         result (rows T.. of it);
 *   out   one block a (chunk, co value columns): O = scale [diag(e^G) Q | P] [S0; U], one
 *         product of [C x (skp + C)] by [(skp + C) x co], straight into the result.
 * Its plan is the backward's (the same cv, offsets' arithmetic and refusals) with the
 * scratch laid out again for the forward's pieces alone, in order G and beta, P, Wk, U, S0
 * (off_ab, off_f, off_g2, off_dr, off_ds and off_part are -1: nothing of the forward reads
 * them), and out's sizes: co = 64 columns where they divide svp (else 32, else 16),
 * narrowed while out's grid is short of DN_BACK_TARGET_BLOCKS. delta_net.cu takes it for a
 * DELTA_NET node whose path is CHUNKED, or AUTO where cu_dn_wy_fwd_auto says so. */
#define DN_WY_FWD_MIN_T 64 /* AUTO: tokens a sequence, at least */

/* Whether a DELTA_NET node of path AUTO with H_v value heads, B sequences and T tokens goes
 * by chunks: T >= DN_WY_FWD_MIN_T, whatever the batch (decode and prefills shorter than a
 * chunk keep the per-token kernel). The per-token kernel's time is T steps whatever the
 * batch (~0.6 us a token for one sequence of 16 heads of 128 in a prefill, more once its
 * grid passes a wave: 3.1 ms for 16 x 512 tokens). The chunk-parallel forward beat it for
 * one sequence too, already with its state walk narrowed to 16 columns (the plan then):
 * H100, bench_delta_net, 16 heads of 128, BF16 products: 1 x 512 tokens 0.141 ms against
 * the per-token 0.299, 1 x 2048 0.494 against 1.921; `lathe bench` of Qwen3.5-0.8B BF16,
 * pp512 55.7k tokens/s against 44.0k, pp2048 68.2k against 38.5k (4b4895b, LATHE_DN_FWD=wy
 * against the rule before, which also asked for 64 walks and 128 chunks and so kept a
 * one-sequence prefill per token); at 64 tokens the two tie. DN_WY_TARGET_BLOCKS then kept
 * one sequence's walk at 64 columns, faster again. */
bool cu_dn_wy_fwd_auto(int64_t hv, int64_t nb, int64_t nt);

bool cu_dn_wy_fwd_plan_init(struct dn_wy_plan *p, int64_t sk, int64_t sv, int64_t hk, int64_t hv,
                         int64_t nb, int64_t nt, char *reason, size_t reason_size);

/* The CU_SCRATCH_WORK bytes each launcher asks for (0: none): the per-token backward's
 * partials, checkpoints and states; the chunked backward's partials and chunk-start
 * states; the chunk-parallel backward's and forward's scratch_floats. */
static inline size_t dn_back_scratch_bytes(const struct dn_back_plan *p)
{
    return p->blocks == 0 ? 0
                          : sizeof(float) * (size_t)(p->blocks * p->part_per_block +
                                                     p->blocks * p->work_per_block);
}
static inline size_t dn_cback_scratch_bytes(const struct dn_cback_plan *p)
{
    return p->blocks == 0 ? 0
                          : sizeof(float) * (size_t)(p->blocks * p->part_per_block +
                                                     p->blocks * p->ckpt_per_block);
}
static inline size_t dn_wy_scratch_bytes(const struct dn_wy_plan *p)
{
    return p->state_blocks == 0 || p->scratch_floats <= 0
               ? 0
               : sizeof(float) * (size_t)p->scratch_floats;
}

#ifdef __cplusplus
}
#endif
#endif
