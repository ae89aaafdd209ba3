// Not written yet: registers nothing.
#include "commands.h"

namespace nvfp4mla::cli {
void add_plan_command(CLI::App&) {}
}  // namespace nvfp4mla::cli
