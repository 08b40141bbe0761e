#pragma once
// A request's whole text from a BatchEngine (kiln serve's engine), for the tests that
// compare it with what Generator says alone.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/batch_engine.h"

namespace kiln::test {

// Greedy, `n` tokens at most; fails the test (instead of hanging) after 60 s. cached: the
// request's cached_tokens (prompt tokens its sequence took from the prefix cache).
inline std::string engine_text(BatchEngine& engine, const std::vector<int32_t>& prompt, int32_t n,
                               int32_t* cached = nullptr) {
  CompletionRequest r;
  r.prompt = prompt;
  r.max_tokens = n;
  r.sampling.temperature = 0;
  std::shared_ptr<CompletionStream> stream = engine.submit(r);
  std::string text;
  CompletionEvent e;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!stream->next(e, std::chrono::milliseconds(100))) continue;
    text += e.text;
    if (e.done) {
      if (cached) *cached = e.cached_tokens;
      return text;
    }
  }
  ADD_FAILURE() << "stream did not end within 60 s";
  return text;
}

}  // namespace kiln::test
