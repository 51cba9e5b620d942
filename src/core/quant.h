/* quant.h (internal): block formats of GGUF's quantised types, and their conversions to
 * and from float32. Layouts follow GGUF exactly (little-endian, blocks packed with no
 * padding); a row of n elements is n / block_size blocks. */
#ifndef LATHE_CORE_QUANT_H
#define LATHE_CORE_QUANT_H

#include <stdint.h>

#define LT_QK4_0 32
#define LT_QK4_1 32
#define LT_QK5_0 32
#define LT_QK5_1 32
#define LT_QK8_0 32
#define LT_QK8_1 32
#define LT_QK_K 256

/* bytes per block */
#define LT_BLOCK_Q4_0 (2 + 16)
#define LT_BLOCK_Q4_1 (2 + 2 + 16)
#define LT_BLOCK_Q5_0 (2 + 4 + 16)
#define LT_BLOCK_Q5_1 (2 + 2 + 4 + 16)
#define LT_BLOCK_Q8_0 (2 + 32)
#define LT_BLOCK_Q8_1 (2 + 2 + 32) /* ggml's current layout; gguf-py's table says 40 (old f32 d, s) */
#define LT_BLOCK_Q2_K (16 + 64 + 2 + 2)
#define LT_BLOCK_Q3_K (32 + 64 + 12 + 2)
#define LT_BLOCK_Q4_K (2 + 2 + 12 + 128)
#define LT_BLOCK_Q5_K (2 + 2 + 12 + 32 + 128)
#define LT_BLOCK_Q6_K (128 + 64 + 16 + 2)
#define LT_BLOCK_Q8_K (4 + 256 + 32)

/* n is a multiple of the type's block size; src and dst must not overlap (the definitions
 * say restrict; not here, so that C++/CUDA code can include this header for the sizes).
 * Results are bit-exact with ggml's reference code and gguf-py's numpy code (quant.c). */
void lt_dequant_q4_0(const void *src, float *dst, int64_t n);
void lt_dequant_q4_1(const void *src, float *dst, int64_t n);
void lt_dequant_q5_0(const void *src, float *dst, int64_t n);
void lt_dequant_q5_1(const void *src, float *dst, int64_t n);
void lt_dequant_q8_0(const void *src, float *dst, int64_t n);
void lt_dequant_q8_1(const void *src, float *dst, int64_t n);
void lt_dequant_q2_k(const void *src, float *dst, int64_t n);
void lt_dequant_q3_k(const void *src, float *dst, int64_t n);
void lt_dequant_q4_k(const void *src, float *dst, int64_t n);
void lt_dequant_q5_k(const void *src, float *dst, int64_t n);
void lt_dequant_q6_k(const void *src, float *dst, int64_t n);
void lt_dequant_q8_k(const void *src, float *dst, int64_t n);

/* Quantisers lathe writes with (convert --outtype q8_0, test data); reference-quality
 * (round to nearest), bit-exact with the gguf package's quantize where it has one. */
void lt_quant_q4_0(const float *src, void *dst, int64_t n);
void lt_quant_q4_1(const float *src, void *dst, int64_t n);
void lt_quant_q5_0(const float *src, void *dst, int64_t n);
void lt_quant_q5_1(const float *src, void *dst, int64_t n);
void lt_quant_q8_0(const float *src, void *dst, int64_t n);

#endif
