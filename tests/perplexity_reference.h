// kiln perplexity against the llama-perplexity references of tests/data/families
// (*.llama-perplexity.txt, made outside the repository as that folder's README says):
// lines "file preset tensor-digest PPL +/-". Preset F32 is the reference file itself; any
// other is `kiln quantize` of it, which must write the tensors llama-quantize wrote, so
// both engines score the same weights.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "kiln/tensor_type.h"
#include "sha256.h"
#include "test_util.h"

namespace kiln::test {

// sha256 of "name type sha256(bytes)\n" over the tensors sorted by name: the files of the
// two engines order their tensors differently.
inline std::string tensor_digest(const std::string& path) {
  auto file = gguf::File::open(path);
  std::vector<std::string> lines;
  for (const gguf::TensorInfo& t : file->tensors())
    lines.push_back(t.name + " " + std::string(type_name(t.type)) + " " + sha256_hex(t.data, t.n_bytes) + "\n");
  std::sort(lines.begin(), lines.end());
  std::string all;
  for (const std::string& l : lines) all += l;
  return sha256_hex(all);
}

// Every line of `references` (a file name in tests/data/families) for the one model
// `name`, whose F32 file is `f32_path`: F32 within 0.05%, quantized within 0.1%.
inline void expect_perplexities_match(const std::string& references, const std::string& name,
                                      const std::string& f32_path, int expected_lines) {
  std::istringstream in(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/families/" + references));
  const std::string story = std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt";
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string file, preset, digest;
    double want = 0, want_err = 0;
    ls >> file >> preset >> digest >> want >> want_err;
    ASSERT_TRUE(ls && file == name) << line;
    SCOPED_TRACE(preset);
    ++n;
    std::string model = f32_path;
    if (preset != "F32") {
      model = temp_dir() + "/" + name + "-" + preset + ".gguf";
      const auto q = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(f32_path) + " " +
                                 shell_quote(model) + " " + preset + " --quiet");
      ASSERT_EQ(q.exit_code, 0) << q.err;
    }
    EXPECT_EQ(tensor_digest(model), digest) << "not the tensors llama.cpp scored";
    const auto r = run_command(shell_quote(kiln_binary()) + " perplexity " + shell_quote(model) + " -f " +
                               shell_quote(story) + " -c 64 -t 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    double ppl = 0, err = 0;
    ASSERT_EQ(std::sscanf(trim(r.out).c_str(), "PPL = %lf +/- %lf", &ppl, &err), 2) << r.out;
    std::printf("[ %s %s ] kiln %.4f vs llama-perplexity %.4f\n", name.c_str(), preset.c_str(), ppl, want);
    const double bound = preset == "F32" ? 5e-4 : 1e-3;
    EXPECT_NEAR(ppl, want, want * bound);
    EXPECT_NEAR(err, want_err, want_err * 5 * bound);
  }
  EXPECT_EQ(n, expected_lines);
}

}  // namespace kiln::test
