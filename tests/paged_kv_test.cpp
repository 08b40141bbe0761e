// Paged KV cache (--kv-layout paged): the block pool's reference counts and copy-on-write,
// attention over block tables against the contiguous cache (the same arithmetic, so equal
// to the bit), whole-model logits and greedy text, parallel sequences sharing a prompt,
// and the CLI's --parallel.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kiln/error.h"
#include "kiln/parallel.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_store_layouts.h"
#include "runtime/paged_kv.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::long_tokens;
using test::stories;

// ---- block pool ---------------------------------------------------------------------

PagedKv::Shape pool_shape(size_t block = 16) {
  PagedKv::Shape s;
  s.n_layers = 2, s.kv_dim = 8, s.head_dim = 4, s.block = block, s.n_ctx = 100;
  return s;
}

// Stores a recognizable key row (layer, pos, tag) for each position in [p0, p1).
void fill(PagedKv& kv, int32_t seq, size_t p0, size_t p1, float tag) {
  float k[8], v[8];
  for (size_t l = 0; l < 2; ++l)
    for (size_t p = p0; p < p1; ++p) {
      for (size_t e = 0; e < 8; ++e) k[e] = tag + float(l * 1000 + p) + 0.01f * e, v[e] = -k[e];
      kv.store(l, seq, p, k, v);
    }
}

// Key e0 of each position of a sequence in layer l.
std::vector<float> keys(const PagedKv& kv, int32_t seq, size_t l) {
  std::vector<float> out;
  kv.for_each_run(l, seq, 0, kv.length(seq), [&](size_t, const uint8_t* k, const uint8_t*, size_t n) {
    for (size_t i = 0; i < n; ++i) out.push_back(reinterpret_cast<const float*>(k + i * kv.k_row_bytes())[0]);
  });
  return out;
}

TEST(PagedKvPool, BlocksOnDemandAndSharedByForks) {
  PagedKv kv(pool_shape());
  const int32_t a = kv.add_sequence();
  EXPECT_EQ(kv.blocks_used(), 0u);
  EXPECT_EQ(kv.allocated_bytes(), 0.0);
  kv.append(a, 20);  // 16 + 4
  fill(kv, a, 0, 20, 0);
  EXPECT_EQ(kv.blocks_used(), 2u);
  const int32_t b = kv.fork(a);
  EXPECT_EQ(kv.length(b), 20u);
  EXPECT_EQ(kv.table(b), kv.table(a));
  EXPECT_EQ(kv.refs(kv.table(a)[0]), 2u);
  EXPECT_EQ(kv.blocks_used(), 2u);
  EXPECT_EQ(kv.blocks_unshared(), 4u);
  EXPECT_EQ(keys(kv, b, 1), keys(kv, a, 1));
}

TEST(PagedKvPool, WritingIntoASharedBlockCopiesIt) {
  PagedKv kv(pool_shape());
  const int32_t a = kv.add_sequence();
  kv.append(a, 20);
  fill(kv, a, 0, 20, 0);
  const int32_t b = kv.fork(a);
  const std::vector<int32_t> before = kv.table(a);
  kv.append(b, 1);  // position 20 lies in the shared partial block 1
  EXPECT_EQ(kv.table(b)[0], before[0]) << "full blocks stay shared";
  EXPECT_NE(kv.table(b)[1], before[1]) << "the partial block is copied for the writer";
  EXPECT_EQ(kv.table(a), before) << "the other sequence keeps its blocks";
  EXPECT_EQ(kv.refs(before[1]), 1u);
  EXPECT_EQ(kv.refs(kv.table(b)[1]), 1u);
  EXPECT_EQ(kv.blocks_used(), 3u);
  fill(kv, b, 16, 21, 0.5f);  // rewrite b's copy: a must not see it
  for (size_t l = 0; l < 2; ++l) {
    const std::vector<float> ka = keys(kv, a, l), kb = keys(kv, b, l);
    ASSERT_EQ(ka.size(), 20u);
    ASSERT_EQ(kb.size(), 21u);
    for (size_t p = 0; p < 16; ++p) EXPECT_EQ(kb[p], ka[p]);
    for (size_t p = 16; p < 20; ++p) {
      EXPECT_EQ(ka[p], float(l * 1000 + p));
      EXPECT_EQ(kb[p], ka[p] + 0.5f);
    }
  }
  // The copy took the shared rows of every layer along (before b rewrote them).
  const int32_t c = kv.fork(a);
  kv.append(c, 1);
  EXPECT_EQ(keys(kv, c, 1).at(17), float(1000 + 17));
}

TEST(PagedKvPool, AtABlockBoundaryNothingIsCopied) {
  PagedKv kv(pool_shape());
  const int32_t a = kv.add_sequence();
  kv.append(a, 32);
  const int32_t b = kv.fork(a);
  kv.append(b, 1);
  EXPECT_EQ(kv.blocks_used(), 3u);
  EXPECT_EQ(kv.refs(kv.table(a)[1]), 2u);
}

TEST(PagedKvPool, FreedBlocksAreReused) {
  PagedKv kv(pool_shape());
  const int32_t a = kv.add_sequence();
  kv.append(a, 40);
  const int32_t b = kv.fork(a);
  kv.append(b, 30);
  const double allocated = kv.allocated_bytes();
  kv.release(b);
  EXPECT_FALSE(kv.alive(b));
  EXPECT_EQ(kv.blocks_used(), 3u);
  EXPECT_EQ(kv.refs(kv.table(a)[2]), 1u);
  kv.truncate(a, 17);  // keeps blocks 0 and 1
  EXPECT_EQ(kv.blocks_used(), 2u);
  EXPECT_EQ(kv.table(a).size(), 2u);
  const int32_t c = kv.add_sequence();
  EXPECT_EQ(c, b) << "ids are reused";
  kv.append(c, 90);
  EXPECT_EQ(kv.blocks_used(), 2u + 6u);
  EXPECT_EQ(kv.allocated_bytes(), allocated) << "freed blocks come back before the pool grows";
  EXPECT_THROW(kv.append(c, 11), Error) << "past n_ctx";
  EXPECT_THROW(kv.truncate(c, 91), Error);
  kv.release(c);
  kv.release(a);
  EXPECT_EQ(kv.blocks_used(), 0u);
  EXPECT_EQ(kv.blocks_unshared(), 0u);
  EXPECT_THROW(kv.fork(a), Error);
}

TEST(PagedKvPool, RefusesWhatTheCacheCannotHold) {
  PagedKv::Shape s = pool_shape(0);
  EXPECT_THROW(PagedKv{s}, Error);
  s = pool_shape();
  s.k_type = TensorType::Q4_K;
  try {
    PagedKv kv(s);
    FAIL() << "q4_k keys accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
  }
}

// ---- attention over a block table vs the contiguous cache -----------------------------

struct AttnCase {
  const char* name;
  TensorType k, v;
  bool flash;
  size_t block;
  bool alibi;
};

// A GQA layer (8 query heads over 2 KV heads of 64) with the same random keys and values
// in both layouts; prefill spans, a decode span and a multi-sequence decode batch.
TEST(PagedAttention, EqualsTheContiguousCacheExactly) {
  const AttnCase cases[] = {
      {"f32", TensorType::F32, TensorType::F32, false, 16, false},
      {"f16_block7", TensorType::F16, TensorType::F16, false, 7, false},
      {"f16_alibi", TensorType::F16, TensorType::F16, false, 16, true},
      {"tiled_f32_block32", TensorType::F32, TensorType::F32, true, 32, false},
      {"tiled_f16_block7", TensorType::F16, TensorType::F16, true, 7, true},
      {"tiled_q8_0", TensorType::Q8_0, TensorType::Q8_0, true, 16, false},
      {"tiled_q4_0_values", TensorType::F16, TensorType::Q4_0, true, 16, false},
  };
  ModelConfig c;
  c.n_layers = 1, c.n_heads = 8, c.n_kv_heads = 2, c.head_dim = 64, c.max_alibi_bias = 8;
  const size_t kv_dim = 128, q_dim = 512, n_ctx = 600, n = 530;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> K(n * kv_dim), V(n * kv_dim), Q(n * q_dim);
  for (float& x : K) x = dist(rng);
  for (float& x : V) x = dist(rng);
  for (float& x : Q) x = dist(rng);
  const std::vector<uint32_t> window{0};
  ThreadPool pool(2);
  for (const AttnCase& tc : cases) {
    SCOPED_TRACE(tc.name);
    c.positions = tc.alibi ? Positions::alibi : Positions::rope;
    const bool transposed = KvCache::is_one_value(tc.v);
    const KvCache::Shape shape{1, n_ctx, kv_dim, 64, tc.k, tc.v, transposed, {}};
    ContiguousKvStore cache(shape, window);
    PagedKvStore paged(shape, tc.block);
    const int32_t s0 = 0;
    cache.append(s0, n);
    paged.append(s0, n);
    for (size_t p = 0; p < n; ++p) {
      cache.store(0, s0, p, &K[p * kv_dim], &V[p * kv_dim]);
      paged.store(0, s0, p, &K[p * kv_dim], &V[p * kv_dim]);
    }
    Attention contiguous(c, window, tc.flash, n_ctx, pool.size(), cache);
    Attention blocks(c, window, tc.flash, n_ctx, pool.size(), paged);
    // A prefill of 300 queries after 200 cached positions, then one decode query.
    for (const QuerySpan sp : {QuerySpan{0, 300, 200, s0}, QuerySpan{0, 1, 529, s0}}) {
      std::vector<float> want(sp.n * q_dim, NAN), got(sp.n * q_dim, NAN);
      contiguous.run(pool, 0, std::span(&sp, 1), &Q[sp.pos * q_dim], want.data());
      blocks.run(pool, 0, std::span(&sp, 1), &Q[sp.pos * q_dim], got.data());
      EXPECT_EQ(got, want) << "span of " << sp.n << " at " << sp.pos;
    }
    // Forks decoding together: each row sees its own sequence, as a lone decode would.
    const int32_t s1 = paged.fork(s0), s2 = paged.fork(s0);
    paged.truncate(s1, 300);
    paged.truncate(s2, 41);
    const QuerySpan spans[] = {{0, 1, 299, s1}, {1, 1, 529, s0}, {2, 1, 40, s2}};
    std::vector<float> q3(3 * q_dim);
    for (size_t i = 0; i < 3; ++i) std::copy_n(&Q[spans[i].pos * q_dim], q_dim, &q3[i * q_dim]);
    std::vector<float> together(3 * q_dim);
    blocks.run(pool, 0, spans, q3.data(), together.data());
    for (size_t i = 0; i < 3; ++i) {
      const QuerySpan alone{0, 1, spans[i].pos, 0};
      std::vector<float> want(q_dim);
      contiguous.run(pool, 0, std::span(&alone, 1), &q3[i * q_dim], want.data());
      EXPECT_EQ(std::vector<float>(&together[i * q_dim], &together[(i + 1) * q_dim]), want) << "row " << i;
    }
  }
}

// ---- whole model ----------------------------------------------------------------------

SessionParams params(KvLayout layout, TensorType t, FlashAttention fa, int32_t block = 16) {
  SessionParams p;
  p.n_ctx = 1024;
  p.n_batch = 512;
  p.n_threads = 2;
  p.kv_type_k = p.kv_type_v = t;
  p.flash_attn = fa;
  p.kv_layout = layout;
  p.kv_block = block;
  return p;
}

// Decoding takes the first 300 tokens: past one tile of keys (256).
std::vector<float> logits(const SessionParams& p, bool token_by_token) {
  Session s(stories(), p);
  std::vector<float> out;
  if (token_by_token) {
    for (size_t i = 0; i < 300; ++i) {
      const int32_t t = long_tokens()[i];
      auto l = s.decode(std::span(&t, 1));
      out.insert(out.end(), l.begin(), l.end());
    }
  } else {
    auto l = s.decode(long_tokens(), true);
    out.assign(l.begin(), l.end());
  }
  return out;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]), norm += double(want[i]) * want[i];
  return err / norm;
}

struct ModelCase {
  const char* name;
  TensorType t;
  FlashAttention fa;
  int32_t block;
};

class PagedModel : public ::testing::TestWithParam<ModelCase> {};

// 700 tokens as one prefill (two batches), and 300 token by token.
TEST_P(PagedModel, LogitsEqualTheContiguousLayout) {
  const ModelCase& m = GetParam();
  for (bool token_by_token : {false, true}) {
    const auto want = logits(params(KvLayout::contiguous, m.t, m.fa), token_by_token);
    const auto got = logits(params(KvLayout::paged, m.t, m.fa, m.block), token_by_token);
    std::printf("[ nmse ] %s %s: %.3g\n", m.name, token_by_token ? "decode" : "prefill", nmse(got, want));
    EXPECT_LE(nmse(got, want), 1e-12);
    EXPECT_TRUE(got == want) << "the same arithmetic in another layout should give the same bits";
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, PagedModel,
                         ::testing::Values(ModelCase{"f32", TensorType::F32, FlashAttention::off, 16},
                                           ModelCase{"f16", TensorType::F16, FlashAttention::off, 16},
                                           ModelCase{"f16_block5", TensorType::F16, FlashAttention::off, 5},
                                           ModelCase{"tiled_f16", TensorType::F16, FlashAttention::on, 32},
                                           ModelCase{"q8_0", TensorType::Q8_0, FlashAttention::automatic, 16}),
                         [](const auto& info) { return std::string(info.param.name); });

std::vector<int32_t> once_upon() { return stories().tokenizer().encode("Once upon a time", true); }

std::vector<int32_t> greedy(const SessionParams& p, int n, const std::vector<int32_t>& prompt = once_upon()) {
  test::GreedyRig rig(p);
  rig.generator.set_ignore_eos(true);
  rig.generator.generate(prompt, n, [](std::string_view) {});
  return rig.generator.history();
}

TEST(PagedGreedy, SameTextAsContiguousFor400Tokens) {
  for (TensorType t : {TensorType::F32, TensorType::F16}) {
    const auto want = greedy(params(KvLayout::contiguous, t, FlashAttention::automatic), 400);
    EXPECT_GT(want.size(), 400u);
    EXPECT_EQ(greedy(params(KvLayout::paged, t, FlashAttention::automatic), 400), want) << type_name(t);
  }
}

TEST(PagedSession, ContiguousRefusesSequencesAndPagedRefusesBadCalls) {
  EXPECT_EQ(SessionParams{}.kv_layout, KvLayout::contiguous) << "the default stays the contiguous cache";
  Session contiguous(stories(), params(KvLayout::contiguous, TensorType::F16, FlashAttention::automatic));
  EXPECT_EQ(contiguous.kv_layout(), KvLayout::contiguous);
  EXPECT_EQ(contiguous.kv_memory().bytes_used, contiguous.kv_cache_bytes());
  EXPECT_EQ(contiguous.kv_memory().blocks_used, 0);
  EXPECT_THROW(contiguous.fork_sequence(0), Error);
  EXPECT_THROW(contiguous.add_sequence(), Error);
  const int32_t tok[1] = {1}, seq[1] = {0};
  contiguous.decode_parallel(seq, tok);  // sequence 0 alone is a plain decode
  EXPECT_EQ(contiguous.n_past(), 1);

  Session paged(stories(), params(KvLayout::paged, TensorType::F16, FlashAttention::automatic));
  EXPECT_EQ(paged.kv_cache_bytes(), 0.0) << "nothing allocated before the first token";
  paged.decode(std::vector<int32_t>{1, 2, 3});
  const int32_t twice[2] = {0, 0}, toks[2] = {1, 2};
  EXPECT_THROW(paged.decode_parallel(twice, toks), Error);
  const int32_t missing[1] = {5};
  EXPECT_THROW(paged.decode_parallel(missing, tok), Error);
  EXPECT_THROW(paged.truncate_sequence(0, 4), Error);
  EXPECT_THROW(paged.truncate_sequence(5, 0), Error);
  EXPECT_EQ(paged.n_past(), 3) << "refused calls change nothing";
}

// Memory with sharing, in blocks of 16: a 50-token prompt (3 full blocks + 2 tokens),
// 4 sequences, 30 more tokens each (positions 50..79: the partial block 3 and block 4).
TEST(PagedSession, SharingHoldsThePromptOnce) {
  Session s(stories(), params(KvLayout::paged, TensorType::F16, FlashAttention::automatic));
  std::vector<int32_t> prompt(long_tokens().begin(), long_tokens().begin() + 50);
  s.decode(prompt);
  std::vector<int32_t> seqs{0};
  for (int i = 1; i < 4; ++i) seqs.push_back(s.fork_sequence(0));
  KvMemory m = s.kv_memory();
  EXPECT_EQ(m.blocks_used, 4);
  EXPECT_EQ(m.blocks_unshared, 16);
  for (int step = 0; step < 30; ++step) {
    const std::vector<int32_t> tokens(4, long_tokens()[size_t(50 + step)]);
    s.decode_parallel(seqs, tokens);
  }
  for (int32_t q : seqs) EXPECT_EQ(s.n_past(q), 80);
  m = s.kv_memory();
  EXPECT_EQ(m.blocks_used, 3 + 4 * 2);
  EXPECT_EQ(m.blocks_unshared, 4 * 5);
  EXPECT_LT(m.bytes_used, m.bytes_unshared);
  // 5 layers x 16 positions x 32 wide x 2 bytes, keys and values.
  EXPECT_EQ(m.bytes_used, 11.0 * 5 * 16 * 32 * 2 * 2);
  for (size_t i = 1; i < seqs.size(); ++i) s.free_sequence(seqs[i]);
  EXPECT_EQ(s.kv_memory().blocks_used, 5);
  EXPECT_THROW(s.n_past(seqs[1]), Error);
}

// Greedy sampling makes every sequence the single run's text; batched decoding must not
// change a token. A 40-token prompt: two full blocks shared.
TEST(Parallel, GreedySequencesEqualTheSingleRun) {
  const std::vector<int32_t> prompt(long_tokens().begin(), long_tokens().begin() + 40);
  const auto single = greedy(params(KvLayout::contiguous, TensorType::F16, FlashAttention::automatic), 120, prompt);
  Session s(stories(), params(KvLayout::paged, TensorType::F16, FlashAttention::automatic));
  ParallelParams pp;
  pp.n_seq = 4, pp.n_predict = 120, pp.ignore_eos = true;
  pp.sampling.temperature = 0, pp.sampling.seed = 42;
  const ParallelResult r = generate_parallel(s, stories().tokenizer(), prompt, pp);
  ASSERT_EQ(r.seqs.size(), 4u);
  const std::vector<int32_t> want(single.begin() + ptrdiff_t(prompt.size()), single.end());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.seqs[i].tokens, want) << "sequence " << i;
    EXPECT_EQ(r.seqs[i].seed, 42u + i);
    EXPECT_EQ(r.seqs[i].stop, StopReason::length);
  }
  EXPECT_EQ(r.n_generated, 480);
  // 40 + 119 positions each: 2 shared blocks + 4 x 8 of their own, against 4 x 10.
  EXPECT_EQ(r.peak.blocks_used, 2 + 4 * 8);
  EXPECT_EQ(r.peak.blocks_unshared, 4 * 10);
  EXPECT_EQ(s.kv_memory().blocks_used, 0) << "every sequence freed at its end";
}

TEST(Parallel, SeedsGiveEachSequenceItsOwnText) {
  Session s(stories(), params(KvLayout::paged, TensorType::F16, FlashAttention::automatic));
  ParallelParams pp;
  pp.n_seq = 3, pp.n_predict = 60;
  pp.sampling.temperature = 1.0f, pp.sampling.seed = 7;
  const std::vector<int32_t> prompt = stories().tokenizer().encode("Once upon a time", true);
  const ParallelResult r = generate_parallel(s, stories().tokenizer(), prompt, pp);
  EXPECT_NE(r.seqs[0].text, r.seqs[1].text);
  EXPECT_NE(r.seqs[1].text, r.seqs[2].text);
  // Sequence i is reproducible on its own: the same seed gives the same draws.
  const ParallelResult again = generate_parallel(s, stories().tokenizer(), prompt, pp);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.seqs[i].tokens, r.seqs[i].tokens);
}

TEST(Parallel, PromptThatLeavesNoRoomIsRefused) {
  SessionParams p = params(KvLayout::paged, TensorType::F16, FlashAttention::automatic);
  p.n_ctx = 8;
  Session s(stories(), p);
  ParallelParams pp;
  pp.n_seq = 2;
  EXPECT_THROW(generate_parallel(s, stories().tokenizer(), std::vector<int32_t>(long_tokens().begin(), long_tokens().begin() + 8), pp),
               Error);
}

// ---- the CLI ----------------------------------------------------------------------------

std::string stories_cmd(const std::string& args) {
  return test::kiln_binary() + " run " + test::shell_quote(test::shared_path("models/stories260K.gguf")) + " " + args;
}

TEST(ParallelCli, PrintsEachSequenceUnderAHeaderAndTheMemory) {
  const auto single = test::run_command(stories_cmd("-p 'Once upon a time' -n 40 --temp 0 --ignore-eos"));
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const auto par = test::run_command(stories_cmd("-p 'Once upon a time' -n 40 --temp 0 --ignore-eos -np 3 -s 5"));
  ASSERT_EQ(par.exit_code, 0) << par.err;
  std::string want;
  for (int i = 0; i < 3; ++i)
    want += std::string(i ? "\n" : "") + "--- sequence " + std::to_string(i) + " (seed " + std::to_string(5 + i) +
            ") ---\n" + single.out;
  EXPECT_EQ(par.out, want);
  EXPECT_NE(par.err.find("unshared copies would take"), std::string::npos) << par.err;
}

TEST(ParallelCli, ErrorsAreOneLine) {
  test::expect_one_line_error(test::run_command(stories_cmd("-p 'Once upon a time there was' -np 2 -c 4")), 1,
                              "leaves no room to generate");
  test::expect_one_line_error(test::run_command(stories_cmd("-p 'Once' -np 2 --kv-layout contiguous")), 2,
                              "--parallel needs --kv-layout paged");
}

// -np: a pp row, then tg rows of 1 and 3 sequences after the shared 40-token prefix.
TEST(ParallelCli, BenchReportsAggregateSpeedAndMemory) {
  const auto r = test::run_command(test::kiln_binary() + " bench " +
                                   test::shell_quote(test::shared_path("models/stories260K.gguf")) +
                                   " -p 40 -n 8 -r 1 -t 1 -np 1,3 -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_TRUE(rows[0]["n_parallel"].is_null());
  for (int i : {1, 2}) {
    const auto& row = rows[size_t(i)];
    EXPECT_EQ(row["n_parallel"], i == 1 ? 1 : 3);
    EXPECT_EQ(row["n_gen"], 8);
    EXPECT_GT(row["avg_ts"].get<double>(), 0.0);
  }
  EXPECT_EQ(rows[1]["kv_layout"], "contiguous");
  EXPECT_EQ(rows[2]["kv_layout"], "paged");
  // 40 + 8 positions per sequence in blocks of 16: 2 shared, 1 each of their own.
  const double block = 5.0 * 16 * 32 * 2 * 2;
  EXPECT_EQ(rows[2]["kv_bytes"].get<double>(), (2 + 3 * 1) * block);
  EXPECT_EQ(rows[2]["kv_bytes_unshared"].get<double>(), 3 * 3 * block);
}

}  // namespace
}  // namespace kiln
