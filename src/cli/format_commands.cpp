// Not written yet: registers nothing.
#include "commands.h"

namespace nvfp4mla::cli {
void add_format_commands(CLI::App&) {}
}  // namespace nvfp4mla::cli
