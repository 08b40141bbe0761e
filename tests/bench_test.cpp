// kiln bench's bandwidth figures (weights GB/s, --roofline) and the bench/compare script
// that puts kiln next to llama.cpp (run here against a stand-in llama-bench).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>
#include <vector>

#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "stories_fixture.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }
CommandResult kiln_run(const std::string& args) { return run_command(shell_quote(kiln_binary()) + " " + args); }

nlohmann::json bench_json(const std::string& args) {
  auto r = kiln_run("bench " + shell_quote(model()) + " " + args + " -o json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::istringstream in(row);
  std::string cell;
  std::getline(in, cell, '|');  // before the first bar
  while (std::getline(in, cell, '|')) out.push_back(trim(cell));
  return out;
}

// The weight bytes a generated token reads: every tensor, but only one row of the token
// embedding table unless the output projection is that table (no output.weight).
uint64_t bytes_per_token(const std::string& path) {
  const auto file = kiln::gguf::File::open(path);
  uint64_t total = 0, embd = 0, embd_row = 0;
  bool tied = true;
  for (const auto& t : file->tensors()) {
    total += t.n_bytes;
    if (t.name == "token_embd.weight") embd = t.n_bytes, embd_row = t.row_bytes();
    if (t.name == "output.weight") tied = false;
  }
  return tied ? total : total - embd + embd_row;
}

}  // namespace

// A tg row streams the weights once per token: GB/s = bytes read per token x tokens/s /
// 1e9; stories260K has its own output.weight, so a token reads one row of its 512 x 64
// f32 embedding table: 1,171,200 - 131,072 + 256 = 1,040,384 bytes.
// Prompt rows have no such figure; nor is there a roofline unless asked for.
TEST(BenchBandwidth, WeightsGbsIsBytesPerTokenTimesTokensPerSecond) {
  const auto rows = bench_json("-p 16 -n 16 -r 2 -t 1");
  ASSERT_EQ(rows.size(), 2u);
  int tg = 0;
  for (const auto& row : rows) {
    EXPECT_TRUE(row["roofline_gbs"].is_null());
    EXPECT_TRUE(row["roofline_pct"].is_null());
    if (row["n_gen"] == 0) {
      EXPECT_TRUE(row["weights_gbs"].is_null()) << row.dump();
      continue;
    }
    ++tg;
    EXPECT_EQ(bytes_per_token(model()), 1040384u);
    const double want = double(bytes_per_token(model())) * row["avg_ts"].get<double>() / 1e9;
    EXPECT_GT(want, 0.0);
    EXPECT_NEAR(row["weights_gbs"].get<double>(), want, want * 1e-12) << row.dump();
  }
  EXPECT_EQ(tg, 1);

  auto csv = kiln_run("bench " + shell_quote(model()) + " -p 16 -n 16 -r 1 -t 1 -o csv");
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  const auto lines = lines_of(trim(csv.out));
  ASSERT_EQ(lines.size(), 3u) << csv.out;
  EXPECT_NE(lines[0].find(",avg_ts,stddev_ts,weights_gbs,roofline_gbs,roofline_pct"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find(",,,"), std::string::npos) << "pp row: empty bandwidth cells: " << lines[1];
}

// A token reads one row of the embedding table, not all of it, unless the output is tied
// to the table (then the output reads all of it). A 32,000-token vocabulary on a tiny
// model is most of the file: counting all of it overstated weights_gbs by about 2x.
TEST(BenchBandwidth, WeightsGbsCountsOneEmbeddingRow) {
  for (const bool tied : {false, true}) {
    kiln::gen::GenerateOptions o;
    o.shape = *kiln::gen::find_shape("tiny");
    o.type = kiln::TensorType::F16;
    o.tie_output = tied;
    const std::string path = temp_dir() + (tied ? "/tied.gguf" : "/untied.gguf");
    kiln::gen::build_model(o, *kiln::gguf::File::open(shared_path("vocab/ggml-vocab-llama-spm.gguf"))).write(path);
    const auto file = kiln::gguf::File::open(path);
    uint64_t total = 0, embd = 0, embd_row = 0;
    for (const auto& t : file->tensors()) {
      total += t.n_bytes;
      if (t.name == "token_embd.weight") embd = t.n_bytes, embd_row = t.row_bytes();
    }
    ASSERT_GT(embd, total / (tied ? 2 : 3)) << "the embedding table should be a big share of the file";
    const uint64_t per_token = tied ? total : total - embd + embd_row;
    EXPECT_EQ(bytes_per_token(path), per_token);
    auto r = kiln_run("bench " + shell_quote(path) + " -p 0 -n 8 -r 1 -t 1 -o json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto rows = nlohmann::json::parse(r.out);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0]["model_size"].get<uint64_t>(), total);
    const double want = double(per_token) * rows[0]["avg_ts"].get<double>() / 1e9;
    EXPECT_NEAR(rows[0]["weights_gbs"].get<double>(), want, want * 1e-12) << (tied ? "tied " : "untied ") << rows[0].dump();
  }
}

// --roofline measures the read bandwidth right before each tg repetition and after the
// last (the machine's bandwidth drifts), prints a line per thread count, and gives each tg
// row the mean of its own measurements and its share: 100 x weights GB/s / roofline GB/s.
TEST(BenchBandwidth, RooflineLineIsPlausibleAndRowsUseIt) {
  // 256 MiB instead of the default 1 GiB keeps the test fast; still far beyond any cache.
  auto md = kiln_run("bench " + shell_quote(model()) + " -p 16 -n 32 -r 2 -t 1 --roofline --roofline-mib 256");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      md.out, m,
      std::regex(R"(memory read bandwidth \(roofline\): ([0-9.]+) GB/s with 1 thread \(median of 3 measurements ([0-9.]+)-([0-9.]+), one before each tg repetition and one after, each the best of 4 passes over 0.25 GiB\))")))
      << md.out;
  const double median = std::stod(m[1]), lo = std::stod(m[2]), hi = std::stod(m[3]);
  // Anything from a slow laptop (a few GB/s) to a many-channel server; sanitizers check
  // every load of the measuring loop, which then reads ~0.4 GB/s.
  const double min_gbs = kSanitized ? 0.05 : 0.5;
  EXPECT_GT(lo, min_gbs) << md.out;
  EXPECT_LT(hi, 5000.0) << md.out;
  EXPECT_LE(lo, median);
  EXPECT_LE(median, hi);
  bool saw_tg = false;
  for (const auto& line : lines_of(md.out)) {
    if (line.find("| tg32 |") == std::string::npos) continue;
    saw_tg = true;
    const auto c = cells(line);
    ASSERT_EQ(c.size(), 10u) << line;  // model size params backend threads test t/s GB/s roofline %
    const double ts = std::stod(c[6]), gbs = std::stod(c[7]), roofline = std::stod(c[8]), pct = std::stod(c[9]);
    EXPECT_NEAR(gbs, 1040384.0 * ts / 1e9, 0.006 + gbs * 1e-3) << line;  // bytes_per_token(model())
    // Its three measurements' mean: within their range.
    EXPECT_GE(roofline, lo - 0.006) << line;
    EXPECT_LE(roofline, hi + 0.006) << line;
    // The row prints both rates to 0.01 GB/s and pct comes from the unrounded ones: at
    // low rates that rounding alone moves pct by a few points.
    EXPECT_NEAR(pct, 100 * gbs / roofline, 0.06 + pct * (0.0051 / gbs + 0.0051 / roofline)) << line;
  }
  EXPECT_TRUE(saw_tg) << md.out;

  // Without a tg test the bandwidth is measured once per thread count (best of 10).
  auto pp = kiln_run("bench " + shell_quote(model()) + " -p 16 -n 0 -r 1 -t 1 --roofline --roofline-mib 256");
  ASSERT_EQ(pp.exit_code, 0) << pp.err;
  EXPECT_TRUE(std::regex_search(pp.out, std::regex(R"(memory read bandwidth \(roofline\): [0-9.]+ GB/s with 1 thread \(best of 10 passes over 0.25 GiB\))")))
      << pp.out;

  const auto rows = bench_json("-p 0 -n 16 -r 1 -t 1 --roofline --roofline-mib 256");
  ASSERT_EQ(rows.size(), 1u);
  const double r = rows[0]["roofline_gbs"].get<double>(), w = rows[0]["weights_gbs"].get<double>();
  EXPECT_GT(r, min_gbs);
  EXPECT_NEAR(rows[0]["roofline_pct"].get<double>(), 100 * w / r, 1e-9 * w / r);
}

// bench/compare on two models with a stand-in llama-bench that logs its arguments and
// prints fixed speeds, and a kiln wrapper that logs before running the real binary.
TEST(BenchCompare, AlternatesEnginesAndPrintsRatios) {
  if (run_command("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 not installed";
  const std::string dir = temp_dir() + "/compare";
  std::filesystem::create_directories(dir + "/build/bin");
  const std::string log = dir + "/log";
  write_file(dir + "/build/bin/llama-bench",
             "#!/bin/sh\necho \"llama $*\" >>" + shell_quote(log) +
                 "\necho '[{\"n_prompt\": 16, \"n_gen\": 0, \"n_threads\": 1, \"avg_ts\": 1000.0},"
                 " {\"n_prompt\": 0, \"n_gen\": 8, \"n_threads\": 1, \"avg_ts\": 100.0}]'\n");
  write_file(dir + "/kiln", "#!/bin/sh\necho \"kiln $*\" >>" + shell_quote(log) + "\nexec " +
                                shell_quote(kiln_binary()) + " \"$@\"\n");
  ASSERT_EQ(run_command("chmod +x " + shell_quote(dir + "/build/bin/llama-bench") + " " + shell_quote(dir + "/kiln"))
                .exit_code, 0);
  const std::string copy = dir + "/copy.gguf";
  std::filesystem::copy_file(model(), copy, std::filesystem::copy_options::overwrite_existing);
  const std::string script = shell_quote(std::string(KILN_SOURCE_DIR) + "/bench/compare");
  const std::string models = shell_quote(model()) + " " + shell_quote(copy);
  const std::string opts = " -p 16 -n 8 -t 1 -r 1 --rounds 2";

  auto r = run_command("LLAMA_CPP=" + shell_quote(dir + "/build") + " KILN=" + shell_quote(dir + "/kiln") + " " +
                       script + " " + models + opts);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Round 1 runs kiln first, round 2 llama.cpp first; same -p/-n/-t/-r for both, and the
  // same -fa: the engines' "auto" differ (llama.cpp's is on for a CPU, kiln's is not).
  const std::string k = "kiln bench ", l = "llama -m ", same = " -p 16 -n 8 -t 1 -fa 1 -r 1 -o json";
  const std::vector<std::string> want = {
      k + model() + same + " --quiet", l + model() + same, k + copy + same + " --quiet", l + copy + same,
      l + model() + same, k + model() + same + " --quiet", l + copy + same, k + copy + same + " --quiet"};
  EXPECT_EQ(lines_of(read_file(log)), want);

  int rows = 0;
  for (const auto& line : lines_of(r.out)) {
    const auto c = cells(line);
    if (c.size() != 6 || (c[1] != "pp16" && c[1] != "tg8")) continue;
    ++rows;
    EXPECT_TRUE(c[0] == "stories260K.gguf" || c[0] == "copy.gguf") << line;
    EXPECT_EQ(c[2], "1") << line;
    const double llama = c[1] == "pp16" ? 1000.0 : 100.0;
    EXPECT_EQ(c[4].substr(0, c[4].find(' ')), c[1] == "pp16" ? "1000.00" : "100.00") << line;
    const double kiln = std::stod(c[3]);
    EXPECT_GT(kiln, 0.0) << line;
    EXPECT_NEAR(std::stod(c[5]), kiln / llama, 0.0051 + 1e-3 * kiln / llama) << line;
  }
  EXPECT_EQ(rows, 4) << r.out;
  EXPECT_NE(r.out.find(dir + "/build/bin/llama-bench -m " + model() + same), std::string::npos) << r.out;

  write_file(log, "");
  auto off = run_command("LLAMA_CPP=" + shell_quote(dir + "/build") + " KILN=" + shell_quote(dir + "/kiln") + " " +
                         script + " " + shell_quote(model()) + " -p 16 -n 8 -t 1 -r 1 --rounds 1 -fa 0");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const std::string same_off = " -p 16 -n 8 -t 1 -fa 0 -r 1 -o json";
  EXPECT_EQ(lines_of(read_file(log)), (std::vector<std::string>{k + model() + same_off + " --quiet", l + model() + same_off}));

  // --kiln-args: more flags for kiln bench only.
  write_file(log, "");
  auto extra = run_command("LLAMA_CPP=" + shell_quote(dir + "/build") + " KILN=" + shell_quote(dir + "/kiln") + " " +
                           script + " " + shell_quote(model()) + " -p 16 -n 8 -t 1 -r 1 --rounds 1 --kiln-args='--no-repack -ctk f16'");
  ASSERT_EQ(extra.exit_code, 0) << extra.err;
  EXPECT_EQ(lines_of(read_file(log)),
            (std::vector<std::string>{k + model() + same + " --no-repack -ctk f16 --quiet", l + model() + same}));

  auto unset = run_command("env -u LLAMA_CPP " + script + " " + models);
  EXPECT_EQ(unset.exit_code, 1);
  EXPECT_NE(unset.err.find("set LLAMA_CPP"), std::string::npos) << unset.err;
  auto wrong = run_command("LLAMA_CPP=" + shell_quote(dir + "/nowhere") + " " + script + " " + models);
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("LLAMA_CPP=" + dir + "/nowhere: no executable llama-bench"), std::string::npos) << wrong.err;
}

// -md: tg rows become greedy generation, one per --draft-max (0: undrafted), with the
// draft_model, n_draft and accept_rate fields; csv carries them too.
TEST(BenchSpeculative, DraftRowsCarryTheDraftAndItsAcceptance) {
  const std::string draft = stories_path("Q4_0");
  const auto rows = bench_json("-p 0 -n 24 -r 2 -t 1 -md " + shell_quote(draft) + " --draft-max 0,4 --no-spec-adaptive");
  ASSERT_EQ(rows.size(), 2u) << rows.dump();
  EXPECT_EQ(rows[0]["n_draft"], 0);
  EXPECT_EQ(rows[0]["draft_model"], draft);
  EXPECT_TRUE(rows[0]["accept_rate"].is_null());
  EXPECT_EQ(rows[1]["n_draft"], 4);
  EXPECT_EQ(rows[1]["draft_model"], draft);
  const double accept = rows[1]["accept_rate"].get<double>();
  EXPECT_GT(accept, 0.0);  // a Q4_0 copy agrees with its F32 model more often than not
  EXPECT_LE(accept, 1.0);
  EXPECT_GT(rows[1]["mean_accepted"].get<double>(), 0.0);
  for (const auto& row : rows) {
    EXPECT_EQ(row["n_gen"], 24);
    EXPECT_GT(row["avg_ts"].get<double>(), 0.0);
  }
  const auto plain = bench_json("-p 0 -n 8 -r 1 -t 1");
  EXPECT_TRUE(plain[0]["n_draft"].is_null());

  auto csv = kiln_run("bench " + shell_quote(model()) + " -p 0 -n 8 -r 1 -t 1 --spec-type ngram --draft-max 3 -o csv");
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  const std::vector<std::string> lines = lines_of(csv.out);
  ASSERT_EQ(lines.size(), 2u) << csv.out;
  EXPECT_NE(lines[0].find(",draft_model,n_draft,accept_rate,mean_accepted"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("\"ngram\",3,"), std::string::npos) << lines[1];

  auto bad = kiln_run("bench " + shell_quote(model()) + " -p 0 -n 8 -md " + shell_quote(draft) + " -np 2");
  expect_one_line_error(bad, 2, "-md/--spec-type");
}

// bench/embed_compare with a stand-in llama-embedding that logs its arguments and checks
// it got the texts file: both engines read the same file, alternating, and the table has
// one row with the ratio of the two rates.
TEST(EmbedCompare, AlternatesEnginesOnTheSameTexts) {
  if (run_command("command -v python3").exit_code != 0) GTEST_SKIP() << "python3 not installed";
  const std::string dir = temp_dir() + "/embed_compare";
  std::filesystem::create_directories(dir + "/bin");
  const std::string log = dir + "/log";
  // Logs its arguments and the line count of the -f file (the argument after -f).
  const std::string logger = "echo \"$0 $*\" >>" + shell_quote(log) +
                             "\nprev=; for a in \"$@\"; do [ \"$prev\" = -f ] && wc -l <\"$a\" >>" + shell_quote(log) +
                             "; prev=$a; done\n";
  write_file(dir + "/bin/llama-embedding", "#!/bin/sh\n" + logger + "sleep 0.2\n");
  write_file(dir + "/kiln", "#!/bin/sh\n" + logger + "exec " + shell_quote(kiln_binary()) + " \"$@\"\n");
  ASSERT_EQ(run_command("chmod +x " + shell_quote(dir + "/bin/llama-embedding") + " " + shell_quote(dir + "/kiln")).exit_code, 0);
  auto r = run_command("LLAMA_CPP=" + shell_quote(dir) + " KILN=" + shell_quote(dir + "/kiln") + " " +
                       shell_quote(std::string(KILN_SOURCE_DIR) + "/bench/embed_compare") + " " + shell_quote(model()) +
                       " --texts 40 --words 6 -t 1 -c 64 --rounds 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = lines_of(read_file(log));
  ASSERT_EQ(lines.size(), 8u) << read_file(log);
  EXPECT_TRUE(lines[0].starts_with(dir + "/kiln embed " + model() + " -f ")) << lines[0];
  EXPECT_TRUE(lines[2].starts_with(dir + "/bin/llama-embedding -m " + model() + " -f ")) << lines[2];
  EXPECT_NE(lines[2].find(" -t 1 -c 64 -b 64 -ub 64 "), std::string::npos) << lines[2];
  EXPECT_TRUE(lines[4].starts_with(dir + "/bin/llama-embedding")) << "round 2 starts with llama.cpp: " << lines[4];
  for (size_t i = 1; i < 8; i += 2) EXPECT_EQ(lines[i], "40") << "every run embeds the 40 texts";
  int rows = 0;
  for (const auto& line : lines_of(r.out)) {
    const auto c = cells(line);
    if (c.size() != 5 || c[0] != "stories260K.gguf") continue;
    ++rows;
    const double kiln = std::stod(c[2]), llama = std::stod(c[3]);
    EXPECT_GT(kiln, 0.0) << line;
    EXPECT_LT(llama, 40 / 0.2 + 1) << "the stand-in sleeps 0.2 s a run: " << line;
    EXPECT_NEAR(std::stod(c[4]), kiln / llama, 0.0051 + 1e-3 * kiln / llama) << line;
  }
  EXPECT_EQ(rows, 1) << r.out;
}
