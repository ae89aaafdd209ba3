// nvfp4mla dcp run: one process of a multi-GPU DCP run over NCCL (docs/DCP.md, "Multi-GPU
// runs"). Every process builds the same seeded problem (nvfp4mla/testing/dcp_step_problem.h, the
// generator the GPU tests use), keeps its rank's share of the cache on its GPU and runs
// cuda::dcp_decode_step over the NCCL communicator; rank 0 also computes the single-GPU answer on
// its GPU and checks the step against it; every rank checks CUDA-graph replay against eager and
// times the step's phases. scripts/dcp_multi_gpu.sh starts one process per GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/dcp_id_file.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/serving/planner.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "device_bytes.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/cuda/dcp_step.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/testing/dcp_step_problem.h"
#endif

namespace nvfp4mla::cli {
namespace {

struct RunOptions {
  int world = 0;
  int rank = -1;
  std::string id_file;
  double id_timeout = 600;
  double nccl_timeout = 300;  // the NCCL join, each collective and wait for the stream, the final flush; 0: no limit
  int device = -1;  // -1: the rank
  int interleave = 1;
  int page_size = 64;
  std::vector<int64_t> contexts{131072, 1048576};
  std::vector<int> rows{64, 128};
  std::vector<int> heads{64, 128};
  std::vector<std::string> formats{"all"};
  int next_n = 1;
  int k = 2048;
  int iters = 20;
  int warmup = 3;
  uint64_t seed = 1;
  std::string nccl_library;
  double kv_budget_gib = 100;
  int layers = 61;
  std::string json;
};

std::vector<RecordSpec> parse_formats(const std::vector<std::string>& names) {
  std::vector<RecordSpec> specs;
  for (const std::string& name : names) {
    if (name == "all") {
      specs.assign(std::begin(kAllRecordSpecs), std::end(kAllRecordSpecs));
      continue;
    }
    auto it = std::find_if(std::begin(kAllRecordSpecs), std::end(kAllRecordSpecs),
                           [&](const RecordSpec& s) { return to_string(s) == name; });
    if (it == std::end(kAllRecordSpecs)) {
      std::string known;
      for (const RecordSpec& s : kAllRecordSpecs) known += " " + to_string(s);
      throw Error("dcp run: --formats: unknown format '" + name + "' (all, or:" + known + ")");
    }
    specs.push_back(*it);
  }
  return specs;
}

// Everything the host can check before touching a GPU or NCCL; throws Error naming the option.
void validate(const RunOptions& o) {
  auto fail = [](const std::string& what) { throw Error("dcp run: " + what); };
  if (o.world < 1) fail("--world must be >= 1 (got " + std::to_string(o.world) + ")");
  if (o.rank < 0 || o.rank >= o.world)
    fail("--rank must be in 0.." + std::to_string(o.world - 1) + " (got " + std::to_string(o.rank) + ")");
  if (o.world > 1 && o.id_file.empty()) fail("--id-file is required when --world > 1 (rank 0 writes the NCCL id there)");
  if (!(o.id_timeout >= 0)) fail("--id-timeout must be >= 0");
  if (!(o.nccl_timeout >= 0)) fail("--nccl-timeout must be >= 0 (0: no limit)");
  if (o.device < -1) fail("--device must be >= 0");
  if (o.interleave < 1 || (o.interleave & (o.interleave - 1)) != 0)
    fail("--interleave must be a power of two (got " + std::to_string(o.interleave) + ")");
  if (o.page_size < 1 || o.page_size % o.interleave != 0)
    fail("--page-size must be a positive multiple of --interleave (got " + std::to_string(o.page_size) + ")");
  if (o.next_n < 1 || o.next_n > 8) fail("--next-n must be in 1..8 (got " + std::to_string(o.next_n) + ")");
  if (o.k < 1 || o.k > kTopkMaxK) fail("-k must be in 1.." + std::to_string(kTopkMaxK) + " (got " + std::to_string(o.k) + ")");
  if (o.contexts.empty() || o.rows.empty() || o.heads.empty() || o.formats.empty())
    fail("--context, --rows, --heads and --formats need at least one value");
  for (int64_t c : o.contexts)
    if (c < 1 || c > (int64_t(1) << 31) - 1) fail("--context must be in 1..2^31-1 (got " + std::to_string(c) + ")");
  for (int r : o.rows)
    if (r < 1 || r % o.next_n != 0)
      fail("--rows must be positive multiples of --next-n (got " + std::to_string(r) + ", next-n " + std::to_string(o.next_n) + ")");
  for (int h : o.heads)
    if (h < 1 || h > 128) fail("--heads must be in 1..128 (got " + std::to_string(h) + ")");
  if (o.iters < 1) fail("--iters must be >= 1");
  if (o.warmup < 0) fail("--warmup must be >= 0");
  if (!(o.kv_budget_gib > 0)) fail("--kv-budget-gib must be > 0");
  if (o.layers < 1) fail("--layers must be >= 1");
  parse_formats(o.formats);
}

constexpr size_t kIdBytes = 128;     // an ncclUniqueId
// How long a failed rank waits for rank 0's id to say so, and how much longer than rank 0 the
// others wait for rank 0's decision.
constexpr double kTellSeconds = 60;

// A rank that fails before the join leaves a failed notice for the run's id, so that the ranks
// waiting to join stop with its reason instead of waiting in the join (which cannot be
// interrupted) for a rank that will never come. A rank other than 0 that failed before it read
// the id waits for it first (at most kTellSeconds; rank 0 writes it right after it starts).
void tell_other_ranks(const RunOptions& o, std::vector<char> id, std::string reason, bool wait_for_id) {
  if (o.world <= 1 || o.rank < 0 || o.rank >= o.world || o.id_file.empty()) return;
  if (reason.rfind("dcp run: ", 0) == 0) reason.erase(0, 9);
  try {
    if (id.empty()) {
      if (!wait_for_id || o.rank == 0 || !(o.id_timeout >= 0)) return;
      const double wait = std::min(o.id_timeout, kTellSeconds);
      std::error_code ec;
      if (!std::filesystem::exists(o.id_file, ec))
        std::fprintf(stderr, "nvfp4mla: rank %d: %s; waiting up to %g s for %s to tell the other ranks\n", o.rank,
                     reason.c_str(), wait, o.id_file.c_str());
      id = read_dcp_id_file(o.id_file, kIdBytes, wait);
    }
    write_dcp_rank_notice(o.id_file, o.rank, id, false, reason);
  } catch (const Error&) {
    // No id to tell, or no notice written: the other ranks stop at their own timeout.
  }
}

#if defined(NVFP4MLA_WITH_CUDA)

// The options every rank of a run must share, as one line (each rank's own are its rank, device,
// files and NCCL library): a rank with other values would issue other collectives.
std::string shared_options(const RunOptions& o) {
  auto list = [](const auto& v) {
    std::string s;
    for (const auto& x : v) {
      if (!s.empty()) s += ",";
      if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) s += x;
      else s += std::to_string(x);
    }
    return s;
  };
  return "world " + std::to_string(o.world) + ", interleave " + std::to_string(o.interleave) + ", page size " +
         std::to_string(o.page_size) + ", next-n " + std::to_string(o.next_n) + ", k " + std::to_string(o.k) + ", context " +
         list(o.contexts) + ", rows " + list(o.rows) + ", heads " + list(o.heads) + ", formats " + list(o.formats) +
         ", iters " + std::to_string(o.iters) + ", warmup " + std::to_string(o.warmup) + ", seed " + std::to_string(o.seed);
}

// The KV capacity per GPU budget (serving planner) with and without DCP: tokens one request may
// hold, and requests of each context that fit.
nlohmann::json capacity(const RunOptions& o, const std::vector<RecordSpec>& specs, bool print) {
  nlohmann::json rows = nlohmann::json::array();
  const DcpPlacement place{o.world, o.interleave};
  if (print) {
    std::printf("\nKV capacity: %.0f GiB per GPU, %d layers, page %d; tokens per request that fit; requests per DCP group\n",
                o.kv_budget_gib, o.layers, o.page_size);
    std::printf("%-26s %10s %14s %16s", "format", "bytes/tok", "tokens/GPU", "max req DCP1");
    std::printf(" %13s%-3d", "max req DCP", o.world);
    for (int64_t c : o.contexts) std::printf(" %9s@%-7lld %7s", "reqs DCP1", static_cast<long long>(c), "DCPN");
    std::printf("\n");
  }
  for (const RecordSpec& spec : specs) {
    serving::CapacityRequest r;
    r.spec = spec;
    r.layers = o.layers;
    r.page_size = o.page_size;
    r.memory_gib = o.kv_budget_gib;
    const serving::CapacityPlan plan = serving::plan_capacity(r);
    nlohmann::json j = {{"format", to_string(spec)},
                        {"bytes_per_token", plan.bytes_per_token},
                        {"tokens_per_gpu", plan.tokens},
                        {"max_request_tokens_dcp1", plan.max_single_request_tokens},
                        // Each of the N ranks holds T tokens of a request of N T tokens (T a
                        // multiple of the page, hence of the interleave).
                        {"max_request_tokens_dcp", plan.max_single_request_tokens * o.world}};
    if (print)
      std::printf("%-26s %10lld %14lld %16lld %16lld", to_string(spec).c_str(), static_cast<long long>(plan.bytes_per_token),
                  static_cast<long long>(plan.tokens), static_cast<long long>(plan.max_single_request_tokens),
                  static_cast<long long>(plan.max_single_request_tokens * o.world));
    nlohmann::json fits = nlohmann::json::array();
    for (int64_t c : o.contexts) {
      const int64_t pages_single = (c + o.page_size - 1) / o.page_size;
      const int64_t pages_rank = (dcp_local_length(place, 0, c) + o.page_size - 1) / o.page_size;  // rank 0 holds the most
      const int64_t single = plan.pages / pages_single, dcp = plan.pages / std::max<int64_t>(pages_rank, 1);
      fits.push_back({{"context", c}, {"requests_dcp1_per_gpu", single}, {"requests_dcp_per_group", dcp}});
      if (print) std::printf(" %17lld %7lld", static_cast<long long>(single), static_cast<long long>(dcp));
    }
    if (print) std::printf("\n");
    j["fits"] = fits;
    rows.push_back(j);
  }
  return rows;
}

void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("dcp run: ") + what + ": " + cudaGetErrorString(e));
}

template <class T>
std::vector<T> download(const DeviceBytes& d, size_t count) {
  std::vector<T> h(count);
  if (count) cu(cudaMemcpy(h.data(), d.as<void>(), count * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return h;
}

// Times the step's phases: events on the (one) local rank's stream before and after each
// all-gather the step issues, around the inner communicator's collectives.
class TimedCommunicator final : public cuda::DcpCommunicator {
 public:
  explicit TimedCommunicator(cuda::DcpCommunicator& inner) : inner_(inner) {}
  ~TimedCommunicator() override {
    for (auto e : before_) cudaEventDestroy(e);
    for (auto e : after_) cudaEventDestroy(e);
  }
  int world_size() const override { return inner_.world_size(); }
  int local_ranks() const override { return inner_.local_ranks(); }
  int local_rank(int i) const override { return inner_.local_rank(i); }
  void all_gather(const void* const* send, void* const* recv, size_t bytes, const cudaStream_t* streams) override {
    if (calls_ == before_.size()) {
      before_.push_back(new_event());
      after_.push_back(new_event());
    }
    cu(cudaEventRecord(before_[calls_], streams[0]), "event");
    inner_.all_gather(send, recv, bytes, streams);
    cu(cudaEventRecord(after_[calls_], streams[0]), "event");
    ++calls_;
  }
  void reset() { calls_ = 0; }
  size_t calls() const { return calls_; }
  cudaEvent_t before(size_t i) const { return before_.at(i); }
  cudaEvent_t after(size_t i) const { return after_.at(i); }

 private:
  static cudaEvent_t new_event() {
    cudaEvent_t e;
    cu(cudaEventCreate(&e), "event");
    return e;
  }
  cuda::DcpCommunicator& inner_;
  std::vector<cudaEvent_t> before_, after_;
  size_t calls_ = 0;
};

float elapsed_us(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cu(cudaEventElapsedTime(&ms, a, b), "event time");
  return ms * 1000.0f;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The phases the step's collectives separate (exact selection: 3 gathers of candidates, 2 of
// partials).
enum Phase { kSelect, kGatherCandidates, kAttention, kGatherPartials, kMerge, kTotal, kGraph, kPhases };
const char* const kPhaseNames[kPhases] = {"local_select_us", "gather_candidates_us", "topk_merge_and_attention_us",
                                          "gather_partials_us", "merge_us", "step_us", "graph_replay_us"};

// Attention against the single GPU: the GPU tests' cosine and LSE limits (output_compare.h) for
// DCP against the single GPU (the element bounds need the fp64 oracle; the GPU tests check them).
struct AttentionCheck {
  double worst_row_cos = 0, whole_cos = 0, worst_lse = 0;
  int64_t failures = 0;
};
AttentionCheck compare_attention(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                                 const std::vector<float>& got_lse, const std::vector<float>& want_lse, double row_cos_limit,
                                 double cos_limit) {
  AttentionCheck c;
  double all_dot = 0, all_got = 0, all_want = 0;
  for (size_t rh = 0; rh < want_lse.size(); ++rh) {
    double dot = 0, ng = 0, nw = 0;
    for (int d = 0; d < kDcpLatentDim; ++d) {
      const double g = codec::bf16_decode(got[rh * kDcpLatentDim + d]), w = codec::bf16_decode(want[rh * kDcpLatentDim + d]);
      dot += g * w;
      ng += g * g;
      nw += w * w;
    }
    if (nw == 0) {
      if (ng != 0 || std::isnan(ng)) ++c.failures;
    } else {
      const double cd = ng > 0 ? 1.0 - dot / std::sqrt(ng * nw) : 1.0;
      c.worst_row_cos = std::max(c.worst_row_cos, cd);
      if (!(cd <= row_cos_limit)) ++c.failures;
      all_dot += dot;
      all_got += ng;
      all_want += nw;
    }
    const float g = got_lse[rh], w = want_lse[rh];
    if (std::isinf(w)) {
      if (!(std::isinf(g) && g < 0)) ++c.failures;
    } else {
      const double d = std::fabs(double(g) - w);
      c.worst_lse = std::max(c.worst_lse, d);
      if (!(d <= 1e-5 || d <= (8.0 / 65536.0) * std::fabs(w))) ++c.failures;
    }
  }
  if (all_want > 0) {
    c.whole_cos = all_got > 0 ? 1.0 - all_dot / std::sqrt(all_got * all_want) : 1.0;
    if (!(c.whole_cos <= cos_limit)) ++c.failures;
  }
  return c;
}

// One (format, context, rows, heads) case on this rank. Every rank runs the same collectives in
// the same order; only rank 0 runs the single-GPU comparison (no collectives there).
nlohmann::json run_case(const RunOptions& o, cuda::DcpCommunicator& comm, cudaStream_t stream, const RecordSpec& spec,
                        int64_t context, int rows, int heads, bool* passed) {
  const int rank = o.rank, world = o.world;
  testing::DcpStepShape shape;
  shape.spec = spec;
  shape.place = {world, o.interleave};
  shape.context_lens.assign(size_t(rows / o.next_n), static_cast<int32_t>(context));
  shape.next_n = o.next_n;
  shape.heads = heads;
  shape.k = o.k;
  shape.page = o.page_size;
  shape.shared_pages = true;  // every request of the batch reads the same pages: one context's memory
  // Only the selected records are written (the others NaN-poisoned: a kernel reading one fails);
  // decode reads no other, and generating 2^20 records per case would dominate the run.
  shape.selected_only = true;
  shape.seed = o.seed;
  const testing::DcpStepProblem p = testing::make_dcp_step_problem(shape);
  const DcpStepArgs a = p.step_args(DcpSelection::exact);
  const DcpStepPlan plan = plan_dcp_step(a, cuda::current_sm_count());
  const size_t rh = size_t(p.rows) * heads, rk = size_t(p.rows) * o.k;

  // This rank's share and its outputs.
  DeviceBytes logits(p.rank_logits[rank].data(), p.rank_logits[rank].size() * 4);
  DeviceBytes lengths(p.rank_lengths[rank].data(), p.rank_lengths[rank].size() * 4);
  DeviceBytes q(p.q.data(), p.q.size() * 2), table(p.table.data(), p.table.size() * 4);
  DeviceBytes cache(p.rank_caches[rank].data(), p.rank_caches[rank].size());
  DeviceBytes out(rh * kDcpLatentDim * 2), lse(rh * 4), indices(rk * 4), length(size_t(p.rows) * 4), values(rk * 4),
      errors(8), workspace(plan.workspace_bytes);
  DcpRankStep st;
  st.logits = logits.as<float>();
  st.lengths = lengths.as<int32_t>();
  st.q = q.as<uint16_t>();
  st.cache = cache.as<uint8_t>();
  st.block_table = table.as<int32_t>();
  st.out = out.as<uint16_t>();
  st.lse = lse.as<float>();
  st.indices = indices.as<int32_t>();
  st.topk_length = length.as<int32_t>();
  st.values = values.as<float>();
  st.errors = errors.as<unsigned long long>();
  void* ws = workspace.as<void>();
  auto step = [&](cuda::DcpCommunicator& c) { cuda::dcp_decode_step(c, a, plan, &st, &ws, plan.workspace_bytes, &stream); };
  // Waits for the stream, its collectives included: bounded by --nccl-timeout (a rank that dies or
  // hangs after the join leaves the others' collective kernels waiting; the communicator is then
  // aborted and the run stops with an error).
  auto wait = [&](const char* what) { cuda::dcp_stream_synchronize(comm, stream, std::string("dcp run: ") + what); };
  const std::pair<const DeviceBytes*, size_t> poisoned[] = {
      {&out, rh * kDcpLatentDim * 2}, {&lse, rh * 4}, {&indices, rk * 4}, {&length, size_t(p.rows) * 4}, {&values, rk * 4}};
  auto poison = [&] {
    for (const auto& [buf, bytes] : poisoned) cu(cudaMemsetAsync(buf->as<void>(), 0xFF, bytes, stream), "poison");
  };
  struct Outputs {
    std::vector<uint16_t> out;
    std::vector<float> lse, values;
    std::vector<int32_t> indices, length;
    unsigned long long errors = 0;
    bool operator==(const Outputs& b) const {
      return out == b.out && indices == b.indices && length == b.length && errors == b.errors &&
             std::memcmp(lse.data(), b.lse.data(), lse.size() * 4) == 0 &&
             std::memcmp(values.data(), b.values.data(), values.size() * 4) == 0;
    }
  };
  auto outputs = [&] {
    wait("step");
    Outputs r{download<uint16_t>(out, rh * kDcpLatentDim), download<float>(lse, rh), download<float>(values, rk),
              download<int32_t>(indices, rk), download<int32_t>(length, size_t(p.rows)), download<unsigned long long>(errors, 1)[0]};
    return r;
  };

  // Eager.
  poison();
  step(comm);
  const Outputs eager = outputs();

  // Every rank's outputs equal rank 0's bit for bit (the same gathered partials are merged).
  auto same_everywhere = [&](const DeviceBytes& buf, size_t bytes) {
    DeviceBytes all(bytes * world);
    const void* send = buf.as<void>();
    void* recv = all.as<void>();
    comm.all_gather(&send, &recv, bytes, &stream);
    wait("gather");
    const std::vector<char> h = download<char>(all, bytes * world);
    for (int r = 1; r < world; ++r)
      if (std::memcmp(h.data(), h.data() + size_t(r) * bytes, bytes) != 0) return false;
    return true;
  };
  const bool ranks_agree = same_everywhere(out, rh * kDcpLatentDim * 2) && same_everywhere(indices, rk * 4) &&
                           same_everywhere(lse, rh * 4);

  // CUDA graph: the whole step, collectives included, replayed against eager.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cu(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  try {
    step(comm);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  cu(cudaStreamEndCapture(stream, &graph), "end capture");
  cu(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
  poison();
  cu(cudaGraphLaunch(exec, stream), "graph launch");
  const bool graph_equal = outputs() == eager;

  // Timing: warm-up, then per-phase medians of eager steps and of graph replays.
  TimedCommunicator timed(comm);
  cudaEvent_t start, end;
  cu(cudaEventCreate(&start), "event");
  cu(cudaEventCreate(&end), "event");
  std::vector<std::vector<float>> samples(kPhases);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    timed.reset();
    cu(cudaEventRecord(start, stream), "event");
    step(timed);
    cu(cudaEventRecord(end, stream), "event");
    wait("step");  // `end` is the stream's last work
    if (timed.calls() != 5) throw Error("dcp run: the step issued " + std::to_string(timed.calls()) + " collectives, expected 5");
    if (it < o.warmup) continue;
    samples[kSelect].push_back(elapsed_us(start, timed.before(0)));
    samples[kGatherCandidates].push_back(elapsed_us(timed.before(0), timed.after(2)));
    samples[kAttention].push_back(elapsed_us(timed.after(2), timed.before(3)));
    samples[kGatherPartials].push_back(elapsed_us(timed.before(3), timed.after(4)));
    samples[kMerge].push_back(elapsed_us(timed.after(4), end));
    samples[kTotal].push_back(elapsed_us(start, end));
  }
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    cu(cudaEventRecord(start, stream), "event");
    cu(cudaGraphLaunch(exec, stream), "graph launch");
    cu(cudaEventRecord(end, stream), "event");
    wait("graph replay");
    if (it >= o.warmup) samples[kGraph].push_back(elapsed_us(start, end));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  // Every rank's medians and graph check, to every rank.
  std::vector<float> mine(kPhases + 1);
  for (int i = 0; i < kPhases; ++i) mine[i] = median(samples[i]);
  mine[kPhases] = graph_equal ? 1.0f : 0.0f;
  DeviceBytes mine_d(mine.data(), mine.size() * 4), all_d(mine.size() * 4 * world);
  {
    const void* send = mine_d.as<void>();
    void* recv = all_d.as<void>();
    comm.all_gather(&send, &recv, mine.size() * 4, &stream);
  }
  wait("gather");
  const std::vector<float> all = download<float>(all_d, mine.size() * world);

  nlohmann::json j = {{"format", to_string(spec)}, {"context", context}, {"rows", p.rows}, {"heads", heads},
                      {"k", o.k}, {"next_n", o.next_n}, {"gathered_bytes_per_layer", plan.gathered_bytes_per_layer},
                      {"ranks_agree", ranks_agree}, {"device_errors", eager.errors}};
  bool graphs_equal = true;
  nlohmann::json per_rank = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    nlohmann::json t;
    for (int i = 0; i < kPhases; ++i) t[kPhaseNames[i]] = all[size_t(r) * mine.size() + i];
    t["graph_equals_eager"] = all[size_t(r) * mine.size() + kPhases] == 1.0f;
    graphs_equal = graphs_equal && t["graph_equals_eager"].get<bool>();
    per_rank.push_back(t);
  }
  j["ranks"] = per_rank;
  j["graph_equals_eager"] = graphs_equal;
  bool ok = ranks_agree && graphs_equal && eager.errors == 0;

  if (rank == 0) {
    // The single GPU on this device: top-k of the whole rows, sparse decode over the whole cache.
    const int sm = cuda::current_sm_count();
    DeviceBytes whole(p.logits.data(), p.logits.size() * 4), whole_len(p.whole_lengths.data(), p.whole_lengths.size() * 4);
    const TopkPlan tp = plan_topk(p.rows, p.max_context, sm);
    DeviceBytes tws(std::max<size_t>(topk_workspace_bytes(tp, p.rows), 1)), sidx(rk * 4), slen(size_t(p.rows) * 4), sval(rk * 4),
        serr(8);
    TopkArgs t = p.whole_topk_args();
    t.values = whole.as<float>();
    t.lengths = whole_len.as<int32_t>();
    cuda::topk(t, tp, tws.as<void>(), std::max<size_t>(topk_workspace_bytes(tp, p.rows), 1),
               {sidx.as<int32_t>(), slen.as<int32_t>(), sval.as<float>()}, serr.as<unsigned long long>(), stream);
    cu(cudaStreamSynchronize(stream), "single-GPU top-k");
    const std::vector<int32_t> single_idx = download<int32_t>(sidx, rk), single_len = download<int32_t>(slen, size_t(p.rows));
    const std::vector<float> single_val = download<float>(sval, rk);
    const bool topk_equal = single_idx == eager.indices && single_len == eager.length &&
                            std::memcmp(single_val.data(), eager.values.data(), rk * 4) == 0 && single_idx == p.want_indices &&
                            single_len == p.want_length;

    std::vector<int32_t> slots(rk);
    const TopkSlotMap m = p.single_slots(p.table.data());
    for (size_t i = 0; i < rk; ++i)
      slots[i] = p.want_indices[i] < 0 ? -1 : static_cast<int32_t>(topk_slot(m, int64_t(i) / o.k, p.want_indices[i]));
    DeviceBytes scache(p.single_cache.data(), p.single_cache.size()), sslots(slots.data(), rk * 4),
        swant_len(p.want_length.data(), size_t(p.rows) * 4), sout(rh * kDcpLatentDim * 2), slse(rh * 4);
    const DecodePlan dp = plan_sparse_decode(spec, p.rows, heads, o.k, sm);
    const size_t dws_bytes = std::max<size_t>(decode_workspace_layout(dp, p.rows, heads).total_bytes, 1);
    DeviceBytes dws(dws_bytes);
    cuda::sparse_decode(spec, p.single_attention_args(q.as<uint16_t>(), scache.as<uint8_t>(), sslots.as<int32_t>(), swant_len.as<int32_t>()),
                        dp, dws.as<void>(), dws_bytes, sout.as<uint16_t>(), slse.as<float>(), stream);
    cu(cudaStreamSynchronize(stream), "single-GPU decode");
    // The GPU tests' limits for the DCP step against the single GPU (dcp_step_test.cpp).
    const double row_cos = cuda::decode_weights_are_bf16(spec, dp) ? 5e-5 : 5e-6;
    const AttentionCheck ac = compare_attention(eager.out, download<uint16_t>(sout, rh * kDcpLatentDim), eager.lse,
                                                download<float>(slse, rh), 4 * row_cos, 2e-5);
    j["topk_equal"] = topk_equal;
    j["attention"] = {{"worst_row_cos_diff", ac.worst_row_cos}, {"whole_cos_diff", ac.whole_cos},
                      {"worst_lse_diff", ac.worst_lse}, {"failures", ac.failures},
                      {"row_cos_limit", 4 * row_cos}, {"cos_limit", 2e-5}};
    ok = ok && topk_equal && ac.failures == 0;
    const auto& t0 = per_rank[0];
    std::printf("%-26s %8lld %5d %5d | %-4s %-4s %-5s %9.2e | %9.1f %9.1f %9.1f %9.1f %8.1f | %9.1f %9.1f | %s\n",
                to_string(spec).c_str(), static_cast<long long>(context), p.rows, heads, topk_equal ? "ok" : "FAIL",
                graphs_equal ? "ok" : "FAIL", ranks_agree ? "ok" : "FAIL", ac.worst_row_cos,
                t0["local_select_us"].get<float>(), t0["gather_candidates_us"].get<float>(),
                t0["topk_merge_and_attention_us"].get<float>(), t0["gather_partials_us"].get<float>(),
                t0["merge_us"].get<float>(), t0["step_us"].get<float>(), t0["graph_replay_us"].get<float>(),
                ok ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  j["passed"] = ok;
  *passed = ok;
  return j;
}

void run_gpu(const RunOptions& o, const std::vector<RecordSpec>& specs) {
  // NVLink SHARP (multicast) stays off unless the site says otherwise.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  const int device = o.device >= 0 ? o.device : o.rank;
  cuda::NcclUniqueId id;
  std::vector<char> id_bytes;  // once written or read
  bool waited_for_id = false;
  static_assert(sizeof(id.bytes) == kIdBytes);
  try {
    const int devices = cuda_device_count();
    if (devices == 0) throw Error("dcp run: no CUDA device");
    if (device >= devices)
      throw Error("dcp run: --device " + std::to_string(device) + " but only " + std::to_string(devices) + " CUDA devices are visible");
    cu(cudaSetDevice(device), "cudaSetDevice");
    std::string why;
    if (!cuda::nccl_available(o.nccl_library, &why)) throw Error("dcp run: " + why);
    if (o.rank == 0) {
      id = cuda::nccl_unique_id(o.nccl_library);
      if (!o.id_file.empty()) write_dcp_id_file(o.id_file, id.bytes, sizeof(id.bytes));
    } else {
      waited_for_id = true;
      const std::vector<char> got = read_dcp_id_file(o.id_file, sizeof(id.bytes), o.id_timeout);
      std::memcpy(id.bytes, got.data(), sizeof(id.bytes));
    }
    id_bytes.assign(id.bytes, id.bytes + sizeof(id.bytes));
    // Nobody enters the join before every rank has said it is ready, with the same options: rank 0
    // waits for every other rank's notice, then says so in its own, which the others wait for (a
    // minute longer than rank 0 waits for them, so that rank 0 always decides first).
    if (o.world > 1 && o.rank == 0) {
      std::fprintf(stderr, "nvfp4mla: rank 0: waiting up to %g s for ranks 1..%d to be ready to join\n", o.id_timeout,
                   o.world - 1);
      await_dcp_ranks(o.id_file, o.world, 0, id_bytes, shared_options(o), o.id_timeout);
      write_dcp_rank_notice(o.id_file, 0, id_bytes, true, shared_options(o));
    } else if (o.world > 1) {
      write_dcp_rank_notice(o.id_file, o.rank, id_bytes, true, shared_options(o));
      std::fprintf(stderr, "nvfp4mla: rank %d: ready; waiting for rank 0 to say every rank is\n", o.rank);
      await_dcp_rank_zero(o.id_file, o.world, o.rank, id_bytes, o.id_timeout + kTellSeconds);
    }
  } catch (const Error& e) {
    tell_other_ranks(o, id_bytes, e.what(), !waited_for_id);
    throw;
  }
  // The join is bounded too: a rank that said it was ready and then died (or hangs) before joining
  // leaves the others here, and a nonblocking communicator lets them give up after --nccl-timeout.
  if (o.world > 1)
    std::fprintf(stderr, "nvfp4mla: rank %d: joining the NCCL communicator (up to %g s)\n", o.rank, o.nccl_timeout);
  auto comm = cuda::make_nccl_communicator(id, o.world, o.rank, o.nccl_library, o.nccl_timeout);
  // Every rank has joined (the join completes when all have): the id and the notices are used up.
  if (o.world > 1) remove_dcp_rank_notice(o.id_file, o.rank);
  if (o.rank == 0 && !o.id_file.empty()) std::remove(o.id_file.c_str());
  cudaStream_t stream;
  cu(cudaStreamCreate(&stream), "stream");

  cudaDeviceProp prop{};
  cu(cudaGetDeviceProperties(&prop, device), "device properties");
  if (o.rank == 0) {
    std::printf("DCP %d over NCCL (one process per GPU), interleave %d, page %d, k %d, next_n %d; rank 0 on %s; "
                "NCCL_NVLS_ENABLE=%s\n",
                o.world, o.interleave, o.page_size, o.k, o.next_n, prop.name, std::getenv("NCCL_NVLS_ENABLE"));
    std::printf("checks: top-k = single GPU bit for bit; graph replay = eager bit for bit; every rank's output the same; "
                "attention vs single GPU (worst row 1-cos). Times: rank 0, medians of %d steps, us\n",
                o.iters);
    std::printf("%-26s %8s %5s %5s | %-4s %-4s %-5s %9s | %9s %9s %9s %9s %8s | %9s %9s |\n", "format", "context", "rows",
                "heads", "topk", "graph", "ranks", "row 1-cos", "select", "gath cand", "attn", "gath part", "merge", "step",
                "graph");
  }
  nlohmann::json cases = nlohmann::json::array();
  int failed = 0;
  for (const RecordSpec& spec : specs)
    for (int64_t context : o.contexts)
      for (int rows : o.rows)
        for (int heads : o.heads) {
          bool ok = false;
          cases.push_back(run_case(o, *comm, stream, spec, context, rows, heads, &ok));
          failed += ok ? 0 : 1;
        }
  const nlohmann::json cap = capacity(o, specs, o.rank == 0);
  cudaStreamDestroy(stream);
  if (o.rank == 0 && !o.json.empty()) {
    const nlohmann::json j = {{"world", o.world},     {"interleave", o.interleave}, {"page_size", o.page_size},
                              {"k", o.k},             {"next_n", o.next_n},         {"iters", o.iters},
                              {"seed", o.seed},       {"device", prop.name},        {"nccl_nvls_enable", std::getenv("NCCL_NVLS_ENABLE")},
                              {"cases", cases},       {"capacity", cap},            {"failed_cases", failed}};
    const std::string text = j.dump(2) + "\n";
    write_file_atomic(o.json, text.data(), text.size());
  }
  if (failed) throw Error("dcp run: " + std::to_string(failed) + " of " + std::to_string(cases.size()) + " cases failed (rank " +
                          std::to_string(o.rank) + ")");
}

#endif

void run(const RunOptions& o) {
  std::vector<RecordSpec> specs;
  try {
    validate(o);
    specs = parse_formats(o.formats);
#if !defined(NVFP4MLA_WITH_CUDA)
    throw Error("dcp run: this build of nvfp4mla has no CUDA support");
#endif
  } catch (const Error& e) {
    tell_other_ranks(o, {}, e.what(), true);
    throw;
  }
#if defined(NVFP4MLA_WITH_CUDA)
  run_gpu(o, specs);
#endif
}

}  // namespace

void add_dcp_run_command(CLI::App* dcp) {
  auto* cmd = dcp->add_subcommand(
      "run", "One process of a multi-GPU DCP run over NCCL (one per GPU; scripts/dcp_multi_gpu.sh starts them): "
             "checks against the single GPU and graph replay, times the step's phases, KV capacity");
  auto o = std::make_shared<RunOptions>();
  cmd->add_option("--world", o->world, "DCP size: processes (GPUs)")->required();
  cmd->add_option("--rank", o->rank, "This process's rank, 0..world-1")->required();
  cmd->add_option("--id-file", o->id_file, "File through which rank 0 hands the NCCL id to the others (a new path per run)");
  cmd->add_option("--id-timeout", o->id_timeout,
                  "Seconds a rank waits for the id file (ranks other than 0), then for every rank's notice that it is ready to join")
      ->capture_default_str();
  cmd->add_option("--nccl-timeout", o->nccl_timeout,
                  "Seconds the NCCL join, each collective (its enqueue, then the wait for the step's kernels) and the final "
                  "flush may take before the rank aborts its communicator and stops with an error (a nonblocking "
                  "communicator; 0: NCCL's blocking calls, no limit)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "CUDA device (default: the rank)");
  cmd->add_option("--interleave", o->interleave, "Tokens per rank block (power of two)")->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "Each rank's page size (a multiple of the interleave)")->capture_default_str();
  cmd->add_option("--context", o->contexts, "Context lengths (tokens per request)")->delimiter(',')->capture_default_str();
  cmd->add_option("--rows", o->rows, "Query rows (requests x next-n)")->delimiter(',')->capture_default_str();
  cmd->add_option("--heads", o->heads, "Attention heads")->delimiter(',')->capture_default_str();
  cmd->add_option("--formats", o->formats, "Record formats: all, or names such as bf16-1152, fp8_ds_mla-656, nvfp4_ds_mla-368-dynamic")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--next-n", o->next_n, "Query rows per request (MTP verifier rows)")->capture_default_str();
  cmd->add_option("-k", o->k, "Top-k")->capture_default_str();
  cmd->add_option("--iters", o->iters, "Timed steps (medians)")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Problem seed (the same on every rank)")->capture_default_str();
  cmd->add_option("--nccl-library", o->nccl_library, "libnccl.so.2 to load (default: the loader's search)");
  cmd->add_option("--kv-budget-gib", o->kv_budget_gib, "KV cache memory per GPU for the capacity table")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Layers for the capacity table")->capture_default_str();
  cmd->add_option("--json", o->json, "Rank 0 writes the cases, every rank's times and the capacity as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace nvfp4mla::cli
