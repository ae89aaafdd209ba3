#include <csignal>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "commands.h"
#include "nvfp4mla/error.h"

int main(int argc, char** argv) {
  // A write past the file size limit (ulimit -f) then fails with EFBIG, which every writer turns
  // into a one-line error after removing its temporary file, instead of the signal killing the
  // process with the temporary left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"nvfp4mla: 4-bit NVFP4 KV-cache records for DeepSeek-style sparse MLA"};
  app.require_subcommand(1);
  // Usage errors read like every other error: one line, same prefix.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("nvfp4mla: error: ") + e.what() + " (run with --help for usage)\n";
  });
  nvfp4mla::cli::add_format_commands(app);
  nvfp4mla::cli::add_calibrate_command(app);
  nvfp4mla::cli::add_eval_command(app);
  nvfp4mla::cli::add_attend_command(app);
  nvfp4mla::cli::add_bench_command(app);
  nvfp4mla::cli::add_plan_command(app);
  nvfp4mla::cli::add_select_command(app);
  nvfp4mla::cli::add_store_command(app);
  nvfp4mla::cli::add_index_command(app);
  nvfp4mla::cli::add_dcp_command(app);
  nvfp4mla::cli::add_info_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const nvfp4mla::Error& e) {
    std::fprintf(stderr, "nvfp4mla: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "nvfp4mla: error: out of memory: the command needs more memory than is available\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvfp4mla: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
