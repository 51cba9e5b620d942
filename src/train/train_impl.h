/* train_impl.h (internal): what the job runner shares with the output writer and the data
 * loader. */
#ifndef LATHE_TRAIN_IMPL_H
#define LATHE_TRAIN_IMPL_H

#include "lathe/model.h"
#include "lathe/status.h"
#include "lathe/tokenizer.h"
#include "lathe/train.h"
#include "train/dataset.h"

/* Writes m's GGUF file anew at path (temporary file, then rename): every metadata key and
 * every tensor as the file has them, except the weights in `list`, whose trained F32
 * values are stored back in the weight's own type (F32, F16 or BF16). */
lt_status lt_train_write_model(const struct lt_model *m, const struct lt_model_replace *list, int n,
                               const char *path);

/* The training data of p (defaults filled): read, tokenized with tok (chat examples through
 * ct, which may be NULL for text), split into *order (validation first, *n_val of them).
 * On failure nothing is kept, and fault (may be NULL) says where (lt_train_data_check). */
lt_status lt_train_data_load(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                             const struct lt_train_params *p, struct lt_dataset *out, int **order,
                             int *n_val, struct lt_train_data_fault *fault);

#endif
