/* train_impl.h (internal): what the job runner shares with the output writer. */
#ifndef LATHE_TRAIN_IMPL_H
#define LATHE_TRAIN_IMPL_H

#include "lathe/model.h"
#include "lathe/status.h"

/* Writes m's GGUF file anew at path (temporary file, then rename): every metadata key and
 * every tensor as the file has them, except the weights in `list`, whose trained F32
 * values are stored back in the weight's own type (F32, F16 or BF16). */
lt_status lt_train_write_model(const struct lt_model *m, const struct lt_model_replace *list, int n,
                               const char *path);

#endif
