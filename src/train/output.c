/* output.c: the model file a full fine-tune writes: the base file's metadata and tensors,
 * with the trained weights converted back to each weight's own type.
 *
 * Tensors are produced one at a time by the writer's fill callback, so the output never
 * needs a second whole copy of the model in memory. */
#include <stdlib.h>
#include <string.h>

#include "lathe/gguf.h"
#include "train/train_impl.h"

struct converted {
    const struct lt_tensor *src; /* F32 trained values */
    enum lt_type type;           /* the type to store */
    int64_t ne0;
};

static lt_status fill_converted(void *user, void *dst, size_t nbytes)
{
    const struct converted *c = user;
    int64_t n = lt_nelements(c->src);
    float *f = malloc((size_t)n * sizeof(float));
    if (!f)
        return lt_fail(LT_ERR_NOMEM, "out of memory writing '%s'", c->src->name);
    lt_status st = lt_tensor_get(c->src, f, 0, (size_t)n * sizeof(float));
    if (st == LT_OK) {
        const struct lt_type_traits *tr = lt_type_traits(c->type);
        size_t row = lt_row_size(c->type, c->ne0);
        for (int64_t r = 0; r < n / c->ne0; r++)
            tr->from_float(f + r * c->ne0, (char *)dst + (size_t)r * row, c->ne0);
    }
    free(f);
    (void)nbytes;
    return st;
}

lt_status lt_train_write_model(const struct lt_model *m, const struct lt_model_replace *list, int n,
                               const char *path)
{
    const struct lt_gguf *g = lt_model_gguf(m);
    int64_t nt = lt_gguf_n_tensors(g);
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    struct converted *conv = calloc((size_t)(n > 0 ? n : 1), sizeof(*conv));
    lt_status st = LT_OK;
    if (!w || !conv) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory writing %s", path);
        goto out_free;
    }
    if ((st = lt_gguf_writer_copy_kv(w, g)) != LT_OK)
        goto out_free;
    int n_conv = 0;
    for (int64_t i = 0; i < nt && st == LT_OK; i++) {
        const struct lt_gguf_tensor_info *ti = lt_gguf_tensor(g, i);
        const struct lt_model_replace *rep = NULL;
        for (int k = 0; k < n && !rep; k++)
            if (!strcmp(list[k].w->name, ti->name))
                rep = &list[k];
        if (!rep) {
            st = lt_gguf_writer_add_tensor(w, ti->name, ti->type, ti->n_dims, ti->ne, ti->data,
                                           ti->nbytes);
            continue;
        }
        const struct lt_type_traits *tr = lt_type_traits(ti->type);
        if (!tr || !tr->from_float) {
            st = lt_fail(LT_ERR_UNSUPPORTED, "cannot store trained '%s' as %s", ti->name,
                         lt_type_name(ti->type));
            break;
        }
        conv[n_conv] = (struct converted){rep->with, ti->type, ti->ne[0]};
        st = lt_gguf_writer_add_tensor_fill(w, ti->name, ti->type, ti->n_dims, ti->ne, ti->nbytes,
                                            fill_converted, &conv[n_conv]);
        n_conv++;
    }
    if (st == LT_OK)
        st = lt_gguf_writer_write(w, path);
out_free:
    free(conv);
    lt_gguf_writer_free(w);
    return st;
}
