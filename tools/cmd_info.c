/* cmd_info.c: `lathe info FILE.gguf` (being written) */
#include <stdio.h>

#include "commands.h"

int cmd_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lathe info: not built yet\n");
    return 1;
}
