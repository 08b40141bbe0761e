// kiln bench MODEL: prompt processing (pp) and generation (tg) speed, like llama-bench,
// with its field names in -o json|csv so scripts written for llama-bench read ours.
// tg rows also get the weight bandwidth they imply (the weight bytes a generated token
// reads: Model::decode_bytes_per_token) and, with --roofline, that as a share of this machine's measured
// memory read bandwidth: how far decoding is from the memory-bound ceiling.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "cli/bench_runs.h"
#include "cli/common.h"
#include "cli/mem_bandwidth.h"
#include "cli/speculation.h"
#include "kernels/kernels.h"
#include "kiln/error.h"
#include "runtime/thread_pool.h"

namespace kiln::cli {
namespace {

struct BenchOptions {
  LogOptions log;
  std::string model;
  std::vector<int32_t> n_prompt{512};
  std::vector<int32_t> n_gen{128};
  std::vector<int32_t> threads;
  int32_t reps = 5;
  int32_t n_batch = 512;
  std::string output = "md";
  bool no_kv_cache = false;
  bool roofline = false;
  int32_t roofline_mib = 0;  // 0: roofline_buffer_bytes()
  RopeOptions rope;
  RepackFlags repack;
  std::vector<std::string> type_k{"f16"}, type_v{"f16"}, flash{"auto"};
  std::vector<int32_t> depth{0};
  std::vector<int32_t> n_parallel;  // -np: tg rows decode this many sequences after a shared prefix
  std::string kv_layout = "contiguous";
  int32_t kv_block = 16;
  SpeculativeOptions spec;             // -md / --spec-type: tg rows are greedy generation, drafted
  std::vector<int32_t> n_draft{8};     // --draft-max, one row each (0: the same generation undrafted)
};

struct TestResult {
  int32_t n_prompt = 0, n_gen = 0, n_threads = 0;
  bool kv_cache = true;
  std::string type_k = "f16", type_v = "f16", flash = "auto";
  int32_t depth = 0;  // tokens already in the cache when the test starts (llama-bench -d)
  // -np: sequences decoding together (0: a plain row), after a shared untimed prefix of
  // `prefix` tokens; the KV memory they held at the end, shared and as unshared copies.
  int32_t n_parallel = 0, prefix = 0;
  bool paged = false;
  double kv_bytes = 0, kv_bytes_unshared = 0;
  // Speculative rows: greedy generation with up to n_draft drafted tokens per step (0: the
  // same generation undrafted, the row to compare with); -1: a plain row.
  int32_t n_draft = -1;
  SpeculativeStats spec;  // summed over the repetitions
  std::vector<double> samples_ns;
  std::vector<double> roofline_gbs;  // --roofline: measured just before each repetition (tg)
  std::string test_time;
  double avg_ns() const {
    double s = 0;
    for (double x : samples_ns) s += x;
    return s / samples_ns.size();
  }
  std::vector<double> samples_ts() const {
    std::vector<double> ts;
    for (double ns : samples_ns) ts.push_back((n_prompt + double(n_gen) * std::max(n_parallel, 1)) * 1e9 / ns);
    return ts;
  }
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / v.size();
  }
  static double stddev(const std::vector<double>& v) {
    if (v.size() < 2) return 0;
    const double m = mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / (v.size() - 1));
  }
  bool is_tg() const { return n_prompt == 0 && n_gen > 0; }
  std::string name() const {
    std::string n = n_gen == 0 ? "pp" + std::to_string(n_prompt) : n_prompt == 0 ? "tg" + std::to_string(n_gen)
                                                                              : "pp" + std::to_string(n_prompt) + "+tg" + std::to_string(n_gen);
    if (n_parallel > 0) n += " x" + std::to_string(n_parallel) + " (pp" + std::to_string(prefix) + " shared)";
    if (n_draft >= 0) n += n_draft > 0 ? " (draft " + std::to_string(n_draft) + ")" : " (undrafted)";
    if (depth > 0) n += " @ d" + std::to_string(depth);
    return kv_cache ? n : n + " (no kv cache)";
  }
};


std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string size_label(uint64_t n_params) {
  char buf[32];
  if (n_params >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.1fB", n_params / 1e9);
  else if (n_params >= 1000000ull) std::snprintf(buf, sizeof buf, "%lluM", (unsigned long long)(n_params / 1000000));
  else std::snprintf(buf, sizeof buf, "%lluK", (unsigned long long)(n_params / 1000));
  return buf;
}

int bench(BenchOptions& o) {
  setup_logging(o.log);
  if (o.output != "md" && o.output != "csv" && o.output != "json") throw UsageError("-o must be md, csv or json");
  if (o.reps < 1) throw UsageError("-r must be at least 1");
  if (o.threads.empty()) o.threads.push_back(physical_core_count());
  const std::string path = resolve_model_path(o.model);
  auto model = load_model(path, o.repack);
  const ModelConfig& c = model->config();
  const std::string model_type = c.arch + " " + size_label(model->n_params()) + " " + type_name(c.weight_type);
  const uint64_t model_bytes = model->weight_bytes();
  const uint64_t token_bytes = model->decode_bytes_per_token();
  const SpecType spec_type_asked = spec_type(o.spec);
  const bool show_spec = spec_type_asked != SpecType::none;
  if (show_spec && (o.no_kv_cache || !o.n_parallel.empty()))
    throw UsageError("-md/--spec-type do not go together with --no-kv-cache or -np");
  for (int32_t k : o.n_draft) {
    SpeculativeParams p = o.spec.params;
    p.draft_max = std::max(k, 1);
    validate(p);
  }
  const std::unique_ptr<Model> draft_model = load_draft_model(o.spec, *model, path, o.repack);

  // --roofline: the read bandwidth is measured right before each tg repetition and after
  // the last (the machine's bandwidth drifts with its neighbours' load, so a figure taken
  // minutes apart from the run would make the share meaningless), and once per thread
  // count that has no tg test. Each measurement is the best of plain and prefetched passes.
  std::unique_ptr<ReadBandwidthProbe> probe;
  std::map<int32_t, std::vector<double>> roofline;  // every measurement, by thread count
  constexpr int kPassesPerRep = 4, kPassesAlone = 10;
  if (o.roofline)
    probe = std::make_unique<ReadBandwidthProbe>(o.roofline_mib > 0 ? size_t(o.roofline_mib) << 20
                                                                     : roofline_buffer_bytes(model_bytes));
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  // GB/s of weights streamed by a tg row (once per step, for all its sequences); 0 for the others.
  const auto bandwidth = [&](const TestResult& r) {
    return r.is_tg() ? double(token_bytes) * TestResult::mean(r.samples_ts()) / std::max(r.n_parallel, 1) / 1e9 : 0.0;
  };
  // A tg row's own measurements; other rows get their thread count's median.
  const auto roofline_of = [&](const TestResult& r) {
    return r.roofline_gbs.empty() ? median(roofline.at(r.n_threads)) : TestResult::mean(r.roofline_gbs);
  };
  const auto roofline_pct = [&](const TestResult& r) { return 100.0 * bandwidth(r) / roofline_of(r); };

  std::vector<TestResult> tests;
  for (int32_t t : o.threads)
    for (const std::string& tk : o.type_k)
      for (const std::string& tv : o.type_v)
        for (const std::string& fa : o.flash)
          for (int32_t d : o.depth) {
            TestResult base;
            base.n_threads = t, base.type_k = tk, base.type_v = tv, base.flash = fa, base.depth = d;
            for (int32_t p : o.n_prompt)
              if (p > 0) tests.push_back(base), tests.back().n_prompt = p;
            for (int32_t g : o.n_gen)
              if (g > 0 && !o.n_parallel.empty()) {
                for (int32_t np : o.n_parallel) {
                  tests.push_back(base), tests.back().n_gen = g, tests.back().n_parallel = np;
                  tests.back().prefix = o.n_prompt.empty() ? 0 : o.n_prompt[0];
                }
              } else if (g > 0 && show_spec) {
                for (int32_t k : o.n_draft) tests.push_back(base), tests.back().n_gen = g, tests.back().n_draft = k;
              } else if (g > 0) {
                tests.push_back(base), tests.back().n_gen = g;
                if (o.no_kv_cache) tests.push_back(base), tests.back().n_gen = g, tests.back().kv_cache = false;
              }
          }
  // Columns for what varies or differs from the defaults, as llama-bench shows them.
  const bool show_types = o.type_k != std::vector<std::string>{"f16"} || o.type_v != std::vector<std::string>{"f16"};
  const bool show_fa = o.flash != std::vector<std::string>{"auto"};
  const bool show_np = !o.n_parallel.empty();
  if (show_np && o.no_kv_cache) throw UsageError("-np and --no-kv-cache do not go together");
  for (int32_t np : o.n_parallel)
    if (np < 1) throw UsageError("-np needs positive sequence counts, got " + std::to_string(np));

  rope_params(o.rope);  // bad flags fail here, before any test
  std::mt19937 rng(1234);
  for (TestResult& r : tests) {
    ModelOptions mo;
    mo.n_threads = r.n_threads, mo.n_batch = o.n_batch;
    mo.n_ctx = std::max(r.depth + r.n_prompt + std::max(r.prefix, 1) + r.n_gen + 1, 16) + (r.n_draft >= 0 ? kSpeculativePrompt : 0);
    mo.cache_type_k = r.type_k, mo.cache_type_v = r.type_v, mo.flash_attn = r.flash;
    r.paged = r.n_parallel > 1 || kv_layout(o.kv_layout) == KvLayout::paged;  // sharing needs blocks
    mo.kv_layout = r.paged ? "paged" : "contiguous", mo.kv_block = o.kv_block;
    mo.rope = o.rope;
    std::unique_ptr<Session> session_ptr;
    try {
      session_ptr = std::make_unique<Session>(*model, session_params(mo, *model));
    } catch (const Error& e) {
      // One impossible combination of a sweep (quantized values without flash attention)
      // should not cost the others: say so and leave its row out.
      spdlog::warn("kiln: skipping {} (type_k {}, type_v {}, fa {}): {}", r.name(), r.type_k, r.type_v, r.flash, e.what());
      r.samples_ns.clear();
      continue;
    }
    Session& session = *session_ptr;
    run_once(session, *model, std::min(r.n_prompt, 16), std::min(r.n_gen, 4), true, rng);  // warm-up
    KvMemory kv;
    if (r.n_parallel > 0) run_parallel_once(session, *model, 1, 2, r.n_parallel, rng, kv);
    r.test_time = now_iso();
    for (int32_t rep = 0; rep < o.reps; ++rep) {
      if (probe && r.is_tg()) {
        r.roofline_gbs.push_back(probe->measure(r.n_threads, kPassesPerRep).gb_per_s);
        roofline[r.n_threads].push_back(r.roofline_gbs.back());
      }
      if (r.n_draft >= 0) {
        r.samples_ns.push_back(run_speculative_once(session, *model, draft_model.get(), o.spec, r.n_draft, mo, r.depth,
                                                    r.n_gen, rng, r.spec));
      } else if (r.n_parallel > 0) {
        r.samples_ns.push_back(run_parallel_once(session, *model, r.depth + r.prefix, r.n_gen, r.n_parallel, rng, kv));
        r.kv_bytes = kv.bytes_used, r.kv_bytes_unshared = kv.bytes_unshared;
      } else {
        r.samples_ns.push_back(run_once(session, *model, r.n_prompt, r.n_gen, r.kv_cache, rng, r.depth));
      }
    }
    if (probe && r.is_tg()) {  // and once after the last: the share is over the mean of both sides
      r.roofline_gbs.push_back(probe->measure(r.n_threads, kPassesPerRep).gb_per_s);
      roofline[r.n_threads].push_back(r.roofline_gbs.back());
    }
    const auto ts = r.samples_ts();
    spdlog::debug("{} t={}: {:.2f} ± {:.2f} t/s", r.name(), r.n_threads, TestResult::mean(ts), TestResult::stddev(ts));
  }

  std::erase_if(tests, [&](const TestResult& r) { return r.samples_ns.empty(); });
  if (tests.empty()) throw Error("no test could run (see the lines above)");
  if (probe)
    for (int32_t t : o.threads)
      if (!roofline.count(t)) roofline[t].push_back(probe->measure(t, kPassesAlone).gb_per_s);

  const std::string isa = kernels::isa_name(kernels::ops().isa);
  for (const auto& [t, bw] : roofline) {
    const auto [lo, hi] = std::minmax_element(bw.begin(), bw.end());
    const std::string line =
        bw.size() == 1 ? fmt::format("memory read bandwidth (roofline): {:.2f} GB/s with {} thread{} (best of {} passes over {:.2f} GiB)",
                                     bw[0], t, t == 1 ? "" : "s", kPassesAlone, probe->bytes() / 1073741824.0)
                       : fmt::format("memory read bandwidth (roofline): {:.2f} GB/s with {} thread{} (median of {} measurements "
                                     "{:.2f}-{:.2f}, one before each tg repetition and one after, each the best of {} passes over {:.2f} GiB)",
                                     median(bw), t, t == 1 ? "" : "s", bw.size(), *lo, *hi, kPassesPerRep,
                                     probe->bytes() / 1073741824.0);
    // Kept off stdout for csv/json so that stays machine-readable (the rows carry it).
    if (o.output == "md") std::printf("%s\n\n", line.c_str());
    else spdlog::info("{}", line);
  }
  const std::string draft_label = spec_type_asked == SpecType::ngram ? "ngram" : o.spec.draft_model;
  if (o.output == "md") {
    std::printf("| model | size | params | backend | threads |%s%s test | t/s | weights GB/s |%s%s%s\n",
                show_types ? " type_k | type_v |" : "", show_fa ? " fa |" : "",
                o.roofline ? " roofline GB/s | % of roofline |" : "",
                show_np ? " kv | KV MiB | KV MiB unshared |" : "", show_spec ? " draft | accept | mean accepted |" : "");
    std::printf("| --- | ---: | ---: | --- | ---: |%s%s ---: | ---: | ---: |%s%s%s\n", show_types ? " ---: | ---: |" : "",
                show_fa ? " ---: |" : "", o.roofline ? " ---: | ---: |" : "", show_np ? " --- | ---: | ---: |" : "",
                show_spec ? " --- | ---: | ---: |" : "");
    for (const TestResult& r : tests) {
      const auto ts = r.samples_ts();
      std::printf("| %s | %.2f MiB | %s | CPU (%s) | %d |", model_type.c_str(), model_bytes / 1048576.0,
                  size_label(model->n_params()).c_str(), isa.c_str(), r.n_threads);
      if (show_types) std::printf(" %s | %s |", r.type_k.c_str(), r.type_v.c_str());
      if (show_fa) std::printf(" %s |", r.flash.c_str());
      std::printf(" %s | %.2f ± %.2f |", r.name().c_str(), TestResult::mean(ts), TestResult::stddev(ts));
      if (r.is_tg()) std::printf(" %.2f |", bandwidth(r));
      else std::printf(" |");
      if (o.roofline) {
        if (r.is_tg()) std::printf(" %.2f | %.1f%% |", roofline_of(r), roofline_pct(r));
        else std::printf(" | |");
      }
      if (show_np && r.n_parallel > 0)
        std::printf(" %s | %.2f | %.2f |", r.paged ? "paged" : "contiguous", r.kv_bytes / 1048576.0,
                    r.kv_bytes_unshared / 1048576.0);
      else if (show_np)
        std::printf(" | | |");
      if (show_spec && r.n_draft > 0)
        std::printf(" %s | %.1f%% | %.2f |", draft_label.c_str(), 100.0 * r.spec.acceptance(), r.spec.mean_accepted());
      else if (show_spec)
        std::printf(" | | |");
      std::printf("\n");
    }
    return 0;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const TestResult& r : tests) {
    const auto ts = r.samples_ts();
    std::vector<double> ns = r.samples_ns;
    nlohmann::json j;
    j["build_commit"] = "kiln";
    j["build_number"] = 0;
    j["cpu_info"] = isa;
    j["gpu_info"] = "";
    j["backends"] = "CPU";
    j["model_filename"] = path;
    j["model_type"] = model_type;
    j["model_size"] = model->weight_bytes();
    j["model_n_params"] = model->n_params();
    j["n_batch"] = o.n_batch;
    j["n_ubatch"] = o.n_batch;
    j["n_threads"] = r.n_threads;
    j["type_k"] = r.type_k;
    j["type_v"] = r.type_v;
    j["flash_attn"] = r.flash;
    j["n_depth"] = r.depth;
    j["n_gpu_layers"] = 0;
    j["no_kv_offload"] = false;
    j["kv_cache"] = r.kv_cache;
    j["n_prompt"] = r.n_prompt;
    j["n_gen"] = r.n_gen;
    j["test_time"] = r.test_time;
    j["avg_ns"] = (uint64_t)r.avg_ns();
    j["stddev_ns"] = (uint64_t)TestResult::stddev(ns);
    j["avg_ts"] = TestResult::mean(ts);
    j["stddev_ts"] = TestResult::stddev(ts);
    j["samples_ns"] = ns;
    j["samples_ts"] = ts;
    // Not llama-bench fields: null where they do not apply (pp rows, no --roofline).
    j["weights_gbs"] = r.is_tg() ? nlohmann::json(bandwidth(r)) : nlohmann::json();
    j["roofline_gbs"] = o.roofline ? nlohmann::json(roofline_of(r)) : nlohmann::json();
    j["roofline_pct"] = o.roofline && r.is_tg() ? nlohmann::json(roofline_pct(r)) : nlohmann::json();
    j["kv_layout"] = r.paged ? "paged" : "contiguous";
    j["n_parallel"] = r.n_parallel > 0 ? nlohmann::json(r.n_parallel) : nlohmann::json();
    j["kv_bytes"] = r.n_parallel > 0 ? nlohmann::json(r.kv_bytes) : nlohmann::json();
    j["kv_bytes_unshared"] = r.n_parallel > 0 ? nlohmann::json(r.kv_bytes_unshared) : nlohmann::json();
    // Speculative rows: the draft ("ngram" for lookup), the draft length cap and the share
    // of drafted tokens kept (null for undrafted rows).
    const bool drafted = r.n_draft > 0;
    j["draft_model"] = r.n_draft >= 0 ? nlohmann::json(draft_label) : nlohmann::json();
    j["n_draft"] = r.n_draft >= 0 ? nlohmann::json(r.n_draft) : nlohmann::json();
    j["accept_rate"] = drafted ? nlohmann::json(r.spec.acceptance()) : nlohmann::json();
    j["mean_accepted"] = drafted ? nlohmann::json(r.spec.mean_accepted()) : nlohmann::json();
    rows.push_back(j);
  }
  if (o.output == "json") {
    std::printf("%s\n", rows.dump(2).c_str());
    return 0;
  }
  const char* fields[] = {"build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
                          "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "type_k",
                          "type_v", "flash_attn", "n_gpu_layers", "no_kv_offload", "kv_cache", "n_prompt", "n_gen",
                          "n_depth", "test_time",
                          "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "weights_gbs", "roofline_gbs", "roofline_pct",
                          "kv_layout", "n_parallel", "kv_bytes", "kv_bytes_unshared", "draft_model", "n_draft",
                          "accept_rate", "mean_accepted"};
  std::string header;
  for (const char* f : fields) header += (header.empty() ? "" : ",") + std::string(f);
  std::printf("%s\n", header.c_str());
  for (const auto& j : rows) {
    std::string line;
    for (const char* f : fields) {
      const auto& v = j[f];
      const std::string cell = v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.is_null() ? "" : v.dump();
      line += (line.empty() ? "" : ",") + cell;
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt processing (pp) and generation (tg) speed");
  cmd->add_option("model", o->model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model, "Model file (GGUF)");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt lengths (comma-separated)")
      ->delimiter(',')->check(CLI::NonNegativeNumber);
  cmd->add_option("-n,--n-gen", o->n_gen, "Generation lengths (comma-separated)")
      ->delimiter(',')->check(CLI::NonNegativeNumber);
  cmd->add_option("-t,--threads", o->threads, "Thread counts (comma-separated; default physical cores)")
      ->delimiter(',')->check(thread_count_check());
  cmd->add_option("-r,--repetitions", o->reps, "Repetitions of each test");
  cmd->add_option("-b,--batch-size", o->n_batch, "Tokens per prefill step")->check(CLI::PositiveNumber);
  cmd->add_option("-o,--output", o->output, "Output format: md, csv or json");
  const auto cache_types = CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}, CLI::ignore_case);
  cmd->add_option("--cache-type-k", o->type_k, "KV cache types of keys (also -ctk; comma-separated)")
      ->delimiter(',')->check(cache_types);
  cmd->add_option("--cache-type-v", o->type_v, "KV cache types of values (also -ctv; comma-separated)")
      ->delimiter(',')->check(cache_types);
  cmd->add_option("--flash-attn", o->flash, "Flash attention (also -fa): on, off, auto, 1, 0 (comma-separated)")
      ->delimiter(',')->transform([](const std::string& v) -> std::string {
        if (v == "1") return "on";
        if (v == "0") return "off";
        return v;
      })
      ->check(CLI::IsMember({"on", "off", "auto"}, CLI::ignore_case));
  cmd->add_option("-d,--n-depth", o->depth, "Tokens already in the KV cache when a test starts (comma-separated)")
      ->delimiter(',')->check(CLI::NonNegativeNumber);
  cmd->add_option("--parallel", o->n_parallel,
                  "Also -np: tg rows decode N sequences at once (one batch per step) after a shared prefix of the first "
                  "-p length, with the KV memory shared and unshared (comma-separated; N > 1 uses the paged layout)")
      ->delimiter(',');
  cmd->add_option("--kv-layout", o->kv_layout, "KV cache layout of every row: contiguous or paged")
      ->check(CLI::IsMember({"contiguous", "paged"}, CLI::ignore_case));
  cmd->add_option("--kv-block", o->kv_block, "Positions per block of the paged KV layout")->check(CLI::Range(1, 1024));
  add_speculative_options(*cmd, o->spec, &o->n_draft);
  add_repack_flags(*cmd, o->repack);
  cmd->add_flag("--no-kv-cache", o->no_kv_cache, "Also run generation recomputing the whole sequence every token");
  cmd->add_flag("--roofline", o->roofline,
                "Measure this machine's memory read bandwidth (same threads) before each tg repetition and give each tg "
                "row's share of it");
  cmd->add_option("--roofline-mib", o->roofline_mib,
                  "MiB read by --roofline (default: 1024 or twice the model, at most a quarter of free memory)")
      ->check(CLI::PositiveNumber);
  add_rope_options(*cmd, o->rope);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return bench(*o); }; });
}

}  // namespace kiln::cli
