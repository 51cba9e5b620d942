/* commands.h: the subcommands of `lathe`, one file each (tools/cmd_<name>.c). Each takes
 * argc/argv after the subcommand name and returns the process exit status. */
#ifndef LATHE_TOOLS_COMMANDS_H
#define LATHE_TOOLS_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_check_ref(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_train(int argc, char **argv);

#endif
