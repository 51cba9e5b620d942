/* lathe.c: the `lathe` command: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
};

static const struct command commands[] = {
    {"bench", cmd_bench, "bench -m MODEL.gguf [-p 512] [-n 128] [-r 3]  prompt and generation speed (llama-bench's table)"},
    {"check-ref", cmd_check_ref, "check-ref MODEL.gguf REF.safetensors  compare with a transformers reference"},
    {"convert", cmd_convert, "convert HF_DIR -o OUT.gguf  convert a Hugging Face checkpoint to GGUF"},
    {"info", cmd_info, "info FILE.gguf            print a GGUF file's metadata and tensors"},
    {"run", cmd_run, "run -m MODEL.gguf -p PROMPT    generate text (streams to stdout; --help lists options)"},
    {"serve", cmd_serve, "serve -m MODEL.gguf [options]  OpenAI-compatible server; trains beside serving"},
    {"tokenize", cmd_tokenize, "tokenize MODEL.gguf       encode stdin / decode ids / render a chat"},
    {"train", cmd_train, "train -m MODEL.gguf (--text F | --examples F.jsonl) --out OUT.gguf  LoRA or full fine-tuning"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: lathe COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %s\n", commands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "lathe: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
