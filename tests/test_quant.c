/* test_quant.c: GGUF block formats (src/core/quant.c).
 *
 * Without arguments it is the unit test: hand-built known-answer blocks, every dequantiser
 * against a per-element reference written here from the layout (element index -> bits),
 * every f16 bit pattern as a block scale, quantise/dequantise round trips within each
 * format's error bound, the quantisers against plain reference loops, and a timing line.
 *
 * With arguments it is the converter tests/py/test_quant_cross.py drives:
 *   test_quant --dequant TYPE IN OUT   IN: raw blocks, OUT: float32 (little-endian host)
 *   test_quant --quant TYPE IN OUT     IN: float32, OUT: raw blocks
 * TYPE is a lathe type name (q4_0, q2_K, ...; case is ignored). Exit 0 on success. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "check.h"
#include "core/quant.h"
#include "lathe/tensor.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(void) { return (float)((rng_next() >> 40) * (1.0 / 16777216.0)); }

static float rng_normal(void)
{
    double u1 = ((rng_next() >> 11) + 1) * (1.0 / 9007199254740993.0);
    double u2 = (rng_next() >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = lt_fp32_to_fp16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static float get_f16(const uint8_t *p) { return lt_fp16_to_fp32((uint16_t)(p[0] | p[1] << 8)); }

static int same_bits(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (a != a && b != b);
}

/* Index of the first element whose bits differ, or -1. */
static long first_diff(const float *a, const float *b, long n)
{
    for (long i = 0; i < n; i++)
        if (!same_bits(a[i], b[i]))
            return i;
    return -1;
}

static enum lt_type type_by_name(const char *name)
{
    for (int t = 0; t < LT_TYPE_COUNT; t++)
        if (lt_type_valid(t) && strcasecmp(lt_type_name((enum lt_type)t), name) == 0)
            return (enum lt_type)t;
    return LT_TYPE_COUNT;
}

/* ---- per-element reference decoders: value of element e (0 <= e < block size) of the
 * block at b, written straight from the layout ---- */

static float ref_q4_0(const uint8_t *b, int e)
{
    int q = e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4;
    return get_f16(b) * (float)(q - 8);
}

static float ref_q4_1(const uint8_t *b, int e)
{
    int q = e < 16 ? b[4 + e] & 15 : b[4 + e - 16] >> 4;
    return get_f16(b) * (float)q + get_f16(b + 2);
}

static int bit_of(const uint8_t *bytes, int k) { return (bytes[k / 8] >> (k % 8)) & 1; }

static float ref_q5_0(const uint8_t *b, int e)
{
    int q = (e < 16 ? b[6 + e] & 15 : b[6 + e - 16] >> 4) + 16 * bit_of(b + 2, e);
    return get_f16(b) * (float)(q - 16);
}

static float ref_q5_1(const uint8_t *b, int e)
{
    int q = (e < 16 ? b[8 + e] & 15 : b[8 + e - 16] >> 4) + 16 * bit_of(b + 4, e);
    return get_f16(b) * (float)q + get_f16(b + 2);
}

static float ref_q8_0(const uint8_t *b, int e) { return get_f16(b) * (float)(int8_t)b[2 + e]; }
static float ref_q8_1(const uint8_t *b, int e) { return get_f16(b) * (float)(int8_t)b[4 + e]; }

/* K-quants: e = 128*half + 32*quarter + l (Q2_K, Q3_K, Q6_K) or 32*sub + l (Q4_K, Q5_K) */
static float ref_q2_k(const uint8_t *b, int e)
{
    int half = e / 128, quarter = e % 128 / 32, l = e % 32;
    int q = (b[16 + 32 * half + l] >> (2 * quarter)) & 3;
    int sc = b[e / 16];
    float d = get_f16(b + 80), dmin = get_f16(b + 82);
    return d * (float)(sc & 15) * (float)q - dmin * (float)(sc >> 4);
}

static float ref_q3_k(const uint8_t *b, int e)
{
    int half = e / 128, quarter = e % 128 / 32, l = e % 32;
    int low = (b[32 + 32 * half + l] >> (2 * quarter)) & 3;
    int high = bit_of(b + l, 4 * half + quarter); /* bit (e / 32) of hmask[l] */
    int j = e / 16;
    /* 6-bit scale j: bits 0-3 are nibble j of bytes 0..7 (low nibbles first), bits 4-5 are
     * the 2-bit field j of bytes 8..11 read as 16 fields, four per byte column */
    int nib = (b[96 + j % 8] >> (4 * (j / 8))) & 15;
    int top = (b[96 + 8 + j % 4] >> (2 * (j / 4))) & 3;
    int scale = nib + 16 * top - 32;
    return get_f16(b + 108) * (float)scale * (float)(low - (high ? 0 : 4));
}

/* 6-bit scale and min of sub-block j from the 12 bytes at s (Q4_K, Q5_K) */
static void ref_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] % 64;
        *mn = s[4 + j] % 64;
    } else {
        *sc = s[8 + j - 4] % 16 + 16 * (s[j - 4] / 64);
        *mn = s[8 + j - 4] / 16 + 16 * (s[j] / 64);
    }
}

static float ref_q4_k(const uint8_t *b, int e)
{
    int sub = e / 32, l = e % 32, sc, mn;
    ref_k4_scale_min(b + 4, sub, &sc, &mn);
    int q = (b[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15;
    return get_f16(b) * (float)sc * (float)q - get_f16(b + 2) * (float)mn;
}

static float ref_q5_k(const uint8_t *b, int e)
{
    int sub = e / 32, l = e % 32, sc, mn;
    ref_k4_scale_min(b + 4, sub, &sc, &mn);
    int q = ((b[48 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15) + 16 * bit_of(b + 16 + l, sub);
    return get_f16(b) * (float)sc * (float)q - get_f16(b + 2) * (float)mn;
}

static float ref_q6_k(const uint8_t *b, int e)
{
    int half = e / 128, quarter = e % 128 / 32, l = e % 32;
    int low = (b[64 * half + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 15;
    int high = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
    int scale = (int8_t)b[192 + e / 16];
    return get_f16(b + 208) * (float)scale * (float)(low + 16 * high - 32);
}

static float ref_q8_k(const uint8_t *b, int e)
{
    float d;
    memcpy(&d, b, 4);
    return d * (float)(int8_t)b[4 + e];
}

/* Byte offsets of each format's f16 fields (filled with sane random values); -1 ends. */
struct format {
    enum lt_type type;
    int block, size;
    float (*ref)(const uint8_t *b, int e);
    int f16_at[3];
};

static const struct format formats[] = {
    {LT_TYPE_Q4_0, 32, LT_BLOCK_Q4_0, ref_q4_0, {0, -1}},
    {LT_TYPE_Q4_1, 32, LT_BLOCK_Q4_1, ref_q4_1, {0, 2, -1}},
    {LT_TYPE_Q5_0, 32, LT_BLOCK_Q5_0, ref_q5_0, {0, -1}},
    {LT_TYPE_Q5_1, 32, LT_BLOCK_Q5_1, ref_q5_1, {0, 2, -1}},
    {LT_TYPE_Q8_0, 32, LT_BLOCK_Q8_0, ref_q8_0, {0, -1}},
    {LT_TYPE_Q8_1, 32, LT_BLOCK_Q8_1, ref_q8_1, {0, 2, -1}},
    {LT_TYPE_Q2_K, 256, LT_BLOCK_Q2_K, ref_q2_k, {80, 82, -1}},
    {LT_TYPE_Q3_K, 256, LT_BLOCK_Q3_K, ref_q3_k, {108, -1}},
    {LT_TYPE_Q4_K, 256, LT_BLOCK_Q4_K, ref_q4_k, {0, 2, -1}},
    {LT_TYPE_Q5_K, 256, LT_BLOCK_Q5_K, ref_q5_k, {0, 2, -1}},
    {LT_TYPE_Q6_K, 256, LT_BLOCK_Q6_K, ref_q6_k, {208, -1}},
    {LT_TYPE_Q8_K, 256, LT_BLOCK_Q8_K, ref_q8_k, {-1}},
};
#define N_FORMATS (int)(sizeof formats / sizeof formats[0])

/* Random block bytes with finite scales (a Q8_K's f32 d included). */
static void random_blocks(const struct format *f, uint8_t *buf, int nblocks)
{
    for (int i = 0; i < nblocks * f->size; i++)
        buf[i] = (uint8_t)rng_next();
    for (int ib = 0; ib < nblocks; ib++) {
        uint8_t *b = buf + (size_t)ib * f->size;
        for (int k = 0; f->f16_at[k] >= 0; k++)
            put_f16(b + f->f16_at[k], (rng_uniform() * 2 - 1) * 3);
        if (f->type == LT_TYPE_Q8_K) {
            float d = (rng_uniform() * 2 - 1) * 1e-2f;
            memcpy(b, &d, 4);
        }
    }
}

/* ---- tests ---- */

static void test_traits(void)
{
    for (int i = 0; i < N_FORMATS; i++) {
        const struct lt_type_traits *tt = lt_type_traits(formats[i].type);
        CHECK(tt && tt->to_float && tt->block_size == formats[i].block &&
                  tt->type_size == (size_t)formats[i].size,
              "type %d", formats[i].type);
    }
    enum lt_type writable[] = {LT_TYPE_Q4_0, LT_TYPE_Q4_1, LT_TYPE_Q5_0, LT_TYPE_Q5_1, LT_TYPE_Q8_0};
    for (int i = 0; i < 5; i++)
        CHECK(lt_type_traits(writable[i])->from_float != NULL, "%s", lt_type_name(writable[i]));
}

/* Blocks whose values were worked out by hand. */
static void test_known_answers(void)
{
    float y[256];

    /* Q4_0, d = 0.5: qs[j] = j | (15 - j) << 4, so y[j] = (j - 8) / 2, y[16 + j] = (7 - j) / 2 */
    uint8_t q40[LT_BLOCK_Q4_0] = {0x00, 0x38};
    for (int j = 0; j < 16; j++)
        q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
    lt_dequant_q4_0(q40, y, 32);
    CHECK(y[0] == -4.0f && y[8] == 0.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f,
          "q4_0: %g %g %g %g %g", y[0], y[8], y[15], y[16], y[31]);

    /* Q4_1, d = 2, m = -1: qs[j] = 0x11 * j gives y[j] = y[16 + j] = 2j - 1 */
    uint8_t q41[LT_BLOCK_Q4_1] = {0x00, 0x40, 0x00, 0xbc};
    for (int j = 0; j < 16; j++)
        q41[4 + j] = (uint8_t)(0x11 * j);
    lt_dequant_q4_1(q41, y, 32);
    CHECK(y[0] == -1.0f && y[5] == 9.0f && y[21] == 9.0f && y[31] == 29.0f, "q4_1");

    /* Q5_0, d = 1, qh = 0x0000ffff: elements 0..15 get bit 4 set, 16..31 do not.
     * qs[j] = 0x0f (low 15, high 0): y[j] = 31 - 16 = 15, y[16 + j] = 0 - 16 = -16 */
    uint8_t q50[LT_BLOCK_Q5_0] = {0x00, 0x3c, 0xff, 0xff, 0x00, 0x00};
    memset(q50 + 6, 0x0f, 16);
    lt_dequant_q5_0(q50, y, 32);
    CHECK(y[0] == 15.0f && y[15] == 15.0f && y[16] == -16.0f && y[31] == -16.0f, "q5_0");

    /* Q8_0, d = 0.25, qs = -16..15 */
    uint8_t q80[LT_BLOCK_Q8_0] = {0x00, 0x34};
    for (int j = 0; j < 32; j++)
        q80[2 + j] = (uint8_t)(int8_t)(j - 16);
    lt_dequant_q8_0(q80, y, 32);
    CHECK(y[0] == -4.0f && y[16] == 0.0f && y[31] == 3.75f, "q8_0");

    /* Q4_K, d = 1, dmin = 0.5; scales 1..8 and mins 0,2,..,14 packed by hand:
     * j < 4 in the low 6 bits of bytes j (scale) and 4 + j (min); j >= 4 split between
     * byte 8 + (j - 4) (scale low nibble, min high nibble) and the top bits of bytes j - 4
     * (scale) and j (min). All values < 16, so the top bits stay clear. q = 3 everywhere. */
    uint8_t q4k[LT_BLOCK_Q4_K] = {0x00, 0x3c, 0x00, 0x38};
    uint8_t *s = q4k + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(j + 1);
        s[4 + j] = (uint8_t)(2 * j);
        s[8 + j] = (uint8_t)((j + 5) | (2 * (j + 4)) << 4);
    }
    memset(q4k + 16, 0x33, 128);
    lt_dequant_q4_k(q4k, y, 256);
    int ok = 1;
    for (int e = 0; e < 256; e++) {
        int j = e / 32;
        ok &= y[e] == (float)(j + 1) * 3.0f - 0.5f * (float)(2 * j);
    }
    CHECK(ok, "q4_k: y[0]=%g y[255]=%g", y[0], y[255]);

    /* Q6_K, d = 0.5, scales[k] = k - 8; ql all 0x21 (low nibble 1, high 2), qh all 0xe4
     * (quarters 0..3 get high bits 0,1,2,3): q = 1 + 0 - 32, 1 + 16 - 32, 2 + 32 - 32,
     * 2 + 48 - 32 for quarters 0..3 of each half. */
    uint8_t q6k[LT_BLOCK_Q6_K];
    memset(q6k, 0x21, 128);
    memset(q6k + 128, 0xe4, 64);
    for (int k = 0; k < 16; k++)
        q6k[192 + k] = (uint8_t)(int8_t)(k - 8);
    q6k[208] = 0x00;
    q6k[209] = 0x38;
    lt_dequant_q6_k(q6k, y, 256);
    const int qv[4] = {-31, -15, 2, 18};
    ok = 1;
    for (int e = 0; e < 256; e++)
        ok &= y[e] == 0.5f * (float)(e / 16 - 8) * (float)qv[e % 128 / 32];
    CHECK(ok, "q6_k: y[0]=%g y[100]=%g", y[0], y[100]);
}

/* Every dequantiser against its per-element reference on random blocks. */
static void test_dequant_vs_reference(void)
{
    enum { NB = 64 };
    uint8_t *buf = malloc((size_t)NB * LT_BLOCK_Q8_K);
    float *y = malloc(sizeof(float) * NB * 256);
    float *r = malloc(sizeof(float) * NB * 256);
    for (int i = 0; i < N_FORMATS; i++) {
        const struct format *f = &formats[i];
        random_blocks(f, buf, NB);
        lt_type_traits(f->type)->to_float(buf, y, (int64_t)NB * f->block);
        for (int ib = 0; ib < NB; ib++)
            for (int e = 0; e < f->block; e++)
                r[ib * f->block + e] = f->ref(buf + (size_t)ib * f->size, e);
        long at = first_diff(y, r, (long)NB * f->block);
        CHECK(at < 0, "%s: element %ld is %.9g, reference %.9g", lt_type_name(f->type), at,
              at < 0 ? 0.0 : y[at], at < 0 ? 0.0 : r[at]);
    }
    free(r);
    free(y);
    free(buf);
}

/* Every f16 bit pattern as a Q8_0 scale (q = 1): checks the block f16 load, subnormals,
 * infinities and nans included, against the scalar converter. */
static void test_all_f16_scales(void)
{
    uint8_t blk[LT_BLOCK_Q8_0] = {0};
    blk[2] = 1;
    float y[32];
    long bad = 0, first = -1;
    for (uint32_t h = 0; h < 65536; h++) {
        blk[0] = (uint8_t)h;
        blk[1] = (uint8_t)(h >> 8);
        lt_dequant_q8_0(blk, y, 32);
        if (!same_bits(y[0], lt_fp16_to_fp32((uint16_t)h))) {
            bad++;
            first = first < 0 ? (long)h : first;
        }
    }
    CHECK(bad == 0, "%ld f16 patterns decode wrongly, first 0x%04lx", bad, first);
}

/* ---- quantisers ---- */

/* Plain reference quantisers, written from ggml's reference algorithm. */
static void refq_q8_0(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax)
            amax = fabsf(x[j]);
    float d = amax / 127;
    float id = d == 0 ? 0 : 1 / d;
    put_f16(b, d);
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void refq_q4_0(const float *x, uint8_t *b)
{
    int imax = 0;
    for (int j = 1; j < 32; j++)
        if (fabsf(x[j]) > fabsf(x[imax]))
            imax = j;
    float d = x[imax] / -8;
    float id = d == 0 ? 0 : 1 / d;
    put_f16(b, d);
    int q[32];
    for (int j = 0; j < 32; j++) {
        float t = x[j] * id;
        t = t + 8.5f;
        q[j] = (int)t < 15 ? (int)t : 15;
    }
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(q[j] + 16 * q[16 + j]);
}

static void refq_q5_1(const float *x, uint8_t *b)
{
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < mn)
            mn = x[j];
        if (x[j] > mx)
            mx = x[j];
    }
    float d = (mx - mn) / 31;
    float id = d == 0 ? 0 : 1 / d;
    put_f16(b, d);
    put_f16(b + 2, mn);
    memset(b + 4, 0, 20);
    for (int j = 0; j < 32; j++) {
        float t = (x[j] - mn) * id;
        t = t + 0.5f;
        int q = (int)t < 31 ? (int)t : 31;
        b[8 + j % 16] |= (uint8_t)((q % 16) << (j < 16 ? 0 : 4));
        b[4 + j / 8] |= (uint8_t)((q / 16) << (j % 8));
    }
}

/* Test rows: gaussian, shifted uniform, outliers, constant, zero, ties of +-max. */
static void fill_row(float *x, int n, int kind)
{
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = rng_normal(); break;
        case 1: x[i] = 5 + rng_uniform(); break;
        case 2: x[i] = rng_normal() * (rng_uniform() < 0.02f ? 100 : 0.1f); break;
        case 3: x[i] = -0.75f; break;
        case 4: x[i] = 0; break;
        default: x[i] = (i % 3 == 0 ? 1.0f : i % 3 == 1 ? -1.0f : 0.25f) * 1e-3f; break;
        }
    }
}
#define N_KINDS 6

struct qformat {
    enum lt_type type;
    int size;
    int qmax;      /* steps on the grid: 15, 31 or 254 (Q8_0 covers -127..127) */
    int symmetric; /* d from the largest magnitude, else from max - min */
    void (*ref)(const float *x, uint8_t *b);
};

static const struct qformat qformats[] = {
    {LT_TYPE_Q4_0, LT_BLOCK_Q4_0, 15, 1, refq_q4_0},
    {LT_TYPE_Q4_1, LT_BLOCK_Q4_1, 15, 0, NULL},
    {LT_TYPE_Q5_0, LT_BLOCK_Q5_0, 31, 1, NULL},
    {LT_TYPE_Q5_1, LT_BLOCK_Q5_1, 31, 0, refq_q5_1},
    {LT_TYPE_Q8_0, LT_BLOCK_Q8_0, 254, 1, refq_q8_0},
};

/* Worst error allowed for a block x[0..31]: half a step for grid values, a whole step where
 * Q4_0/Q5_0 clip the value opposite the extreme, plus the f16 rounding of d (at most 2^-11
 * relative, times the largest |q|) and of the Q*_1 minimum. */
static double block_bound(const struct qformat *f, const float *x)
{
    float mn = x[0], mx = x[0], amax = 0;
    for (int j = 0; j < 32; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    }
    double u = 1.0 / 2048;
    if (f->type == LT_TYPE_Q8_0) {
        double d = amax / 127.0;
        return 0.5 * d + 127 * d * u + 1e-6 * amax;
    }
    if (f->symmetric) {
        double d = amax / ((f->qmax + 1) / 2.0);
        return d + (f->qmax + 1) / 2.0 * d * u + 1e-6 * amax;
    }
    double d = ((double)mx - mn) / f->qmax;
    return 0.5 * d + f->qmax * d * u + fabs(mn) * u + 1e-6 * (fabs(mx) + fabs(mn));
}

static void test_round_trips(void)
{
    enum { N = 32 * 64 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *q = malloc((size_t)N / 32 * LT_BLOCK_Q8_0), *rq = malloc((size_t)N / 32 * LT_BLOCK_Q8_0);
    for (int i = 0; i < 5; i++) {
        const struct qformat *f = &qformats[i];
        const struct lt_type_traits *tt = lt_type_traits(f->type);
        for (int kind = 0; kind < N_KINDS; kind++) {
            fill_row(x, N, kind);
            tt->from_float(x, q, N);
            tt->to_float(q, y, N);
            double worst = 0;
            for (int ib = 0; ib < N / 32; ib++) {
                double bound = block_bound(f, x + ib * 32);
                for (int j = 0; j < 32; j++) {
                    double err = fabs((double)x[ib * 32 + j] - y[ib * 32 + j]);
                    double r = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
                    worst = r > worst ? r : worst;
                }
            }
            CHECK(worst <= 1.0, "%s kind %d: error %.3f of the bound", tt->name, kind, worst);
            if (kind == 0)
                printf("%-5s gaussian round trip: nmse %.3g, worst error %.2f of bound\n", tt->name,
                       check_nmse(y, x, N), worst);
            /* zero rows come back exactly; so does -0.75 where d is exact in f16 (all but
             * Q8_0, whose d = 0.75 / 127 is rounded) */
            if (kind == 4 || (kind == 3 && f->type != LT_TYPE_Q8_0)) {
                int exact = 1;
                for (int j = 0; j < N; j++)
                    exact &= y[j] == x[j];
                CHECK(exact, "%s kind %d: constant row not exact (y[0]=%g)", tt->name, kind, y[0]);
            }
            if (f->ref) {
                for (int ib = 0; ib < N / 32; ib++)
                    f->ref(x + ib * 32, rq + (size_t)ib * f->size);
                CHECK(memcmp(q, rq, (size_t)N / 32 * f->size) == 0, "%s kind %d: bytes differ from reference",
                      tt->name, kind);
            }
        }
    }
    free(rq);
    free(q);
    free(y);
    free(x);
}

/* Non-finite input must not crash or trap; the output is unspecified. */
static void test_nonfinite_input(void)
{
    float x[32];
    uint8_t b[LT_BLOCK_Q8_0];
    for (int j = 0; j < 32; j++)
        x[j] = (float)j;
    x[3] = NAN;
    x[7] = INFINITY;
    for (int i = 0; i < 5; i++)
        lt_type_traits(qformats[i].type)->from_float(x, b, 32);
    CHECK(1, "reached");
}

/* Dequantisation speed (informational: the machine is shared). */
static void bench_dequant(void)
{
    enum { NEL = 1 << 20, REPS = 8 };
    uint8_t *buf = malloc((size_t)NEL / 32 * LT_BLOCK_Q8_1 + (size_t)NEL / 256 * LT_BLOCK_Q8_K);
    float *y = malloc(sizeof(float) * NEL);
    printf("dequant speed (%d elements x %d):", NEL, REPS);
    for (int i = 0; i < N_FORMATS; i++) {
        const struct format *f = &formats[i];
        random_blocks(f, buf, NEL / f->block);
        void (*fn)(const void *, float *, int64_t) = lt_type_traits(f->type)->to_float;
        fn(buf, y, NEL); /* warm: first touch of y, caches */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int r = 0; r < REPS; r++)
            fn(buf, y, NEL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf(" %s %.2f", lt_type_name(f->type), (double)NEL * REPS / s * 1e-9);
    }
    printf(" (Gelem/s)\n");
    free(y);
    free(buf);
}

/* ---- converter mode ---- */

static int convert(const char *mode, const char *tname, const char *in, const char *out)
{
    int rc = 2;
    enum lt_type t = type_by_name(tname);
    const struct lt_type_traits *tt = t < LT_TYPE_COUNT ? lt_type_traits(t) : NULL;
    int dequant = strcmp(mode, "--dequant") == 0;
    if (!tt || !(dequant ? tt->to_float != NULL : tt->from_float != NULL)) {
        fprintf(stderr, "test_quant: cannot %s type '%s'\n", mode + 2, tname);
        return 2;
    }
    FILE *fi = fopen(in, "rb");
    if (!fi) {
        fprintf(stderr, "test_quant: cannot open %s\n", in);
        return 2;
    }
    fseek(fi, 0, SEEK_END);
    long size = ftell(fi);
    fseek(fi, 0, SEEK_SET);
    size_t in_unit = dequant ? tt->type_size : sizeof(float) * (size_t)tt->block_size;
    size_t out_unit = dequant ? sizeof(float) * (size_t)tt->block_size : tt->type_size;
    if (size < 0 || (size_t)size % in_unit != 0) {
        fprintf(stderr, "test_quant: %s: %ld bytes is not whole blocks\n", in, size);
        goto out_close_in;
    }
    size_t units = (size_t)size / in_unit;
    void *src = malloc((size_t)size + 1), *dst = malloc(units * out_unit + 1);
    if (!src || !dst || fread(src, 1, (size_t)size, fi) != (size_t)size) {
        fprintf(stderr, "test_quant: cannot read %s\n", in);
        goto out_free;
    }
    int64_t n = (int64_t)units * tt->block_size;
    if (dequant)
        tt->to_float(src, dst, n);
    else
        tt->from_float(src, dst, n);
    FILE *fo = fopen(out, "wb");
    if (!fo || fwrite(dst, 1, units * out_unit, fo) != units * out_unit || fclose(fo) != 0) {
        fprintf(stderr, "test_quant: cannot write %s\n", out);
        goto out_free;
    }
    rc = 0;
out_free:
    free(dst);
    free(src);
out_close_in:
    fclose(fi);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        if (argc != 5 || (strcmp(argv[1], "--dequant") != 0 && strcmp(argv[1], "--quant") != 0)) {
            fprintf(stderr, "usage: test_quant [--dequant|--quant TYPE IN OUT]\n");
            return 2;
        }
        return convert(argv[1], argv[2], argv[3], argv[4]);
    }
    test_traits();
    test_known_answers();
    test_dequant_vs_reference();
    test_all_f16_scales();
    test_round_trips();
    test_nonfinite_input();
    bench_dequant();
    return check_summary();
}
