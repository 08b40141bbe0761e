#pragma once
// What many runtime tests share: stories260K loaded once per test program, a ~700-token
// text of it, and a greedy generator over a session.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/generator.h"
#include "kiln/model.h"
#include "kiln/sampler.h"
#include "kiln/session.h"
#include "test_util.h"

namespace kiln::test {

inline const Model& stories() {
  static std::unique_ptr<Model> model = Model::load(shared_path("models/stories260K.gguf"));
  return *model;
}

// stories260K with quantized weights ("Q8_0", "Q4_0", ...) so that the packed quantized
// kernels run: the path of a copy made by `kiln quantize` once per test program, and the
// copy loaded once. "F32" is the model itself.
inline std::string stories_path(const std::string& type) {
  const std::string f32 = shared_path("models/stories260K.gguf");
  if (type == "F32") return f32;
  const std::string path = temp_dir() + "/stories260K-" + type + ".gguf";
  if (!std::filesystem::exists(path)) {
    const auto r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(f32) + " " +
                               shell_quote(path) + " " + type);
    if (r.exit_code != 0) throw std::runtime_error("kiln quantize failed: " + r.err);
  }
  return path;
}
inline const Model& stories(const std::string& type) {
  if (type == "F32") return stories();
  static std::map<std::string, std::unique_ptr<Model>> models;
  std::unique_ptr<Model>& m = models[type];
  if (!m) m = Model::load(stories_path(type));
  return *m;
}

// tests/data/story.txt twice, cut at 700 tokens: more than two key blocks of the tiled
// attention (256) and more than one block of queries per task.
inline const std::vector<int32_t>& long_tokens() {
  static const std::vector<int32_t> tokens = [] {
    const std::string story = read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt");
    std::vector<int32_t> t = stories().tokenizer().encode(story + "\n" + story, true);
    t.resize(std::min<size_t>(t.size(), 700));
    return t;
  }();
  return tokens;
}

// Greedy decoding of stories260K through a session of the given parameters.
struct GreedyRig {
  explicit GreedyRig(const SessionParams& p)
      : session(stories(), p), sampler(greedy_params(), stories().config().n_vocab),
        generator(session, stories().tokenizer(), sampler) {}
  static SamplerParams greedy_params() {
    SamplerParams sp;
    sp.temperature = 0;
    return sp;
  }
  Session session;
  Sampler sampler;
  Generator generator;
};

}  // namespace kiln::test
