// Temporary: replaced by the real command files.
#include "commands.h"
namespace nvfp4mla::cli {
void add_format_commands(CLI::App&) {}
void add_calibrate_command(CLI::App&) {}
void add_eval_command(CLI::App&) {}
}
