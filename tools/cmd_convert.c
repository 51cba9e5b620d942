/* cmd_convert.c: `lathe convert HF_DIR -o OUT.gguf [--outtype f32|f16|bf16|q8_0] [-v]`.
 * Converts a Hugging Face checkpoint folder to GGUF (see include/lathe/convert.h). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "lathe/convert.h"

static void convert_usage(FILE *f)
{
    fprintf(f, "usage: lathe convert HF_DIR -o OUT.gguf [--outtype f32|f16|bf16|q8_0] [-v]\n"
               "  HF_DIR    a Hugging Face model folder: config.json, model.safetensors (or\n"
               "            shards with model.safetensors.index.json), optionally tokenizer.json\n"
               "  -o        the GGUF file to write (replaced only when the conversion succeeds)\n"
               "  --outtype type of the 2-D weight matrices (default f16); norms, biases and\n"
               "            1-D tensors stay f32\n"
               "  -v        list every tensor as it is planned\n");
}

static void log_line(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "%s\n", line);
}

static void log_warnings(void *user, const char *line)
{
    (void)user;
    if (!strncmp(line, "warning:", 8))
        fprintf(stderr, "%s\n", line);
}

int cmd_convert(int argc, char **argv)
{
    struct lt_convert_params p = {.outtype = LT_CONVERT_OUT_F16, .log = log_warnings};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--outfile")) {
            if (++i >= argc) {
                fprintf(stderr, "lathe convert: %s needs a path\n", a);
                return 2;
            }
            p.out_path = argv[i];
        } else if (!strcmp(a, "--outtype")) {
            if (++i >= argc) {
                fprintf(stderr, "lathe convert: --outtype needs a type\n");
                return 2;
            }
            if (lt_convert_outtype_parse(argv[i], &p.outtype) != LT_OK) {
                fprintf(stderr, "lathe convert: %s\n", lt_last_error());
                return 2;
            }
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            p.log = log_line;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "lathe convert: unknown option '%s'\n", a);
            convert_usage(stderr);
            return 2;
        } else if (!p.hf_dir) {
            p.hf_dir = a;
        } else {
            fprintf(stderr, "lathe convert: more than one HF_DIR ('%s', '%s')\n", p.hf_dir, a);
            return 2;
        }
    }
    if (!p.hf_dir || !p.out_path) {
        convert_usage(stderr);
        return 2;
    }
    struct lt_convert_stats s;
    lt_status st = lt_convert_hf_to_gguf(&p, &s);
    if (st != LT_OK) {
        fprintf(stderr, "lathe convert: %s: %s\n", lt_status_name(st), lt_last_error());
        return 1;
    }
    printf("wrote %s: %lld tensors, %lld parameters, %lld tokens, %lld bytes (%s)\n", p.out_path,
           (long long)s.n_tensors, (long long)s.n_params, (long long)s.n_vocab,
           (long long)s.n_bytes, lt_convert_outtype_name(p.outtype));
    return 0;
}
