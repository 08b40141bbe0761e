// Heap allocations on the per-token path: once a Session (and a Sampler) are warmed up,
// decoding and sampling one more token must not allocate. alloc_hook.cpp replaces the
// global operator new/delete and, on glibc without sanitizers, malloc itself, so memory
// taken by any library (spdlog, the C++ runtime, the thread pool's callables) is counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/model.h"
#include "kiln/sampler.h"
#include "kiln/session.h"
#include "runtime/thread_pool.h"
#include "alloc_hook.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::AllocationWindow;

// The counter itself must see allocations, or every expectation below passes vacuously.
TEST(AllocationCounter, SeesNewAndMalloc) {
  AllocationWindow w;
  std::vector<int>* v = new std::vector<int>(100);
  delete v;
  EXPECT_EQ(w.stop(), 2);  // the vector object and its buffer
  if (!test::AllocationWindow::counts_malloc()) return;
  AllocationWindow m;
  void* volatile p = std::malloc(64);  // volatile: the unused pair must not be elided
  std::free(p);
  EXPECT_EQ(m.stop(), 1);
}

int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

std::unique_ptr<Model> stories() { return Model::load(test::stories_path("F32")); }

// The F32 model, or a Q8_0 copy (quantized weights take the packed-kernel path, with its
// 8-bit activation buffers). A fresh Model each time: its allocations are part of a test.
std::unique_ptr<Model> stories(const std::string& type) { return Model::load(test::stories_path(type)); }

class DecodeAllocations : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::unique_ptr<Model> model = stories(std::get<0>(GetParam()));
  SessionParams params() const {
    SessionParams sp;
    sp.n_ctx = 256;
    sp.n_threads = std::get<1>(GetParam());
    return sp;
  }
};

// Greedy decoding, one token per call, as `kiln run` does after the prompt.
TEST_P(DecodeAllocations, SingleTokenDecodeAllocatesNothing) {
  Session session(*model, params());
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  int32_t token = argmax(session.decode(prompt));
  for (int i = 0; i < 8; ++i) token = argmax(session.decode(std::span(&token, 1)));  // warm-up

  AllocationWindow w;
  for (int i = 0; i < 100; ++i) token = argmax(session.decode(std::span(&token, 1)));
  const long n = w.stop();
  EXPECT_EQ(n, 0) << "allocations over 100 decoded tokens, first sizes: " << AllocationWindow::sizes();
  EXPECT_EQ(session.n_past(), (int32_t)prompt.size() + 108);
}

// The same batch again after truncating: at 2 threads the matmuls go through the pool.
TEST_P(DecodeAllocations, RepeatedBatchAllocatesNothing) {
  Session session(*model, params());
  std::vector<int32_t> batch(64);
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = int32_t(1 + (i * 37) % 500);
  session.decode(batch);
  session.reset();
  session.decode(batch);

  AllocationWindow w;
  for (int i = 0; i < 5; ++i) {
    session.reset();
    session.decode(batch);
  }
  const long n = w.stop();
  EXPECT_EQ(n, 0) << "allocations over 5 batches of 64 tokens, first sizes: " << AllocationWindow::sizes();
}

INSTANTIATE_TEST_SUITE_P(ModelsAndThreads, DecodeAllocations,
                         ::testing::Combine(::testing::Values("F32", "Q8_0"), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "threads";
                         });

// The whole token loop of generation: sample with every stage of the chain and the
// penalties on, record, decode.
TEST(TokenLoopAllocations, SampleAcceptDecodeAllocatesNothing) {
  auto model = stories();
  SessionParams sp;
  sp.n_ctx = 256;
  sp.n_threads = 2;
  Session session(*model, sp);
  SamplerParams p;
  p.seed = 7;
  p.repeat_penalty = 1.1f;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  p.penalty_last_n = 16;
  Sampler sampler(p, (int32_t)model->config().n_vocab);
  const int32_t bos = 1;
  std::span<const float> logits = session.decode(std::span(&bos, 1));
  sampler.accept(bos);
  const auto step = [&] {
    const int32_t t = sampler.sample(logits);
    sampler.accept(t);
    logits = session.decode(std::span(&t, 1));
  };
  for (int i = 0; i < 24; ++i) step();  // fills the penalty window, grows the scratch

  AllocationWindow w;
  for (int i = 0; i < 100; ++i) step();
  const long n = w.stop();
  EXPECT_EQ(n, 0) << "allocations over 100 generated tokens, first sizes: " << AllocationWindow::sizes();
}

// The pool hands callables to its workers without copying them: captures far larger
// than any small-buffer optimization must not reach the heap.
TEST(ThreadPoolAllocations, RunAndParallelForAllocateNothing) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  size_t a = 1, b = 2, c = 3, d = 4;  // five references captured: 40 bytes
  const auto body = [&](size_t lo, size_t hi) { total += (hi - lo) * (a + b + c + d); };
  pool.run([&](int t, int n) { total += size_t(t + n) + a + b + c + d; });  // warm-up

  AllocationWindow w;
  for (int i = 0; i < 50; ++i) {
    pool.run([&](int t, int n) { total += size_t(t + n) + a + b + c + d; });
    pool.parallel_for(1000, 16, body);
    pool.parallel_for_dynamic(1000, 48, body);
  }
  const long n = w.stop();
  EXPECT_EQ(n, 0) << "allocations over 150 pool calls, first sizes: " << AllocationWindow::sizes();
  EXPECT_GT(total.load(), 0u);
}

}  // namespace
}  // namespace kiln
