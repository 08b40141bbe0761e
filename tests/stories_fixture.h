#pragma once
// What many runtime tests share: stories260K loaded once per test program, a ~700-token
// text of it, and a greedy generator over a session.
#include <algorithm>
#include <memory>
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
