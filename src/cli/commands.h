#pragma once
// Each subcommand lives in its own file and registers itself on the CLI11 app;
// main.cpp only lists them.
#include <CLI/CLI.hpp>

namespace nvfp4mla::cli {

// SMs of the GPU a plan is made for when neither an option nor a device says (H100 and H200: 132).
constexpr int kDefaultSmCount = 132;

void add_format_commands(CLI::App& app);  // encode, decode, inspect, abi (format_commands.cpp)
void add_calibrate_command(CLI::App& app);  // calibrate (calibrate_command.cpp)
void add_eval_command(CLI::App& app);  // eval (eval_command.cpp)
void add_store_command(CLI::App& app);  // store (KV offload store) (store_command.cpp)
void add_attend_command(CLI::App& app);  // attend (attend_command.cpp)
void add_bench_command(CLI::App& app);  // bench (bench_command.cpp)
void add_plan_command(CLI::App& app);  // plan (plan_command.cpp)
void add_select_command(CLI::App& app);  // select (top-k) (select_command.cpp)
void add_index_command(CLI::App& app);  // index encode (index_command.cpp)
void add_dcp_command(CLI::App& app);  // dcp union, dcp run (dcp_command.cpp)
void add_dcp_run_command(CLI::App* dcp);  // dcp run (dcp_run_command.cpp), under `dcp`
void add_info_command(CLI::App& app);  // info (info_command.cpp)

}  // namespace nvfp4mla::cli
