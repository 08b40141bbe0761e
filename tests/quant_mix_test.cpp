// kiln quantize's presets and per-tensor type rules (src/quantize/mix.h) on hand-made
// tensor lists, for the cases the llama-quantize tables of quant_llama_tables_test.cpp
// cannot reach (70B models, refusals, tensor order, every GQA ratio).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "quantize/mix.h"

namespace kiln::quantize {
namespace {

// ---------------------------------------------------------------- presets

TEST(QuantizePresets, NamesFileTypesAndBaseTypes) {
  struct Want {
    const char* name;
    uint32_t file_type;  // LLAMA_FTYPE_MOSTLY_* in llama.cpp's include/llama.h
    TensorType base;
    bool mix;
  };
  const Want want[] = {
      {"Q8_0", 7, TensorType::Q8_0, false},    {"Q4_0", 2, TensorType::Q4_0, false},
      {"Q4_1", 3, TensorType::Q4_1, false},    {"Q5_0", 8, TensorType::Q5_0, false},
      {"Q5_1", 9, TensorType::Q5_1, false},    {"Q2_K", 10, TensorType::Q2_K, true},
      {"Q3_K_S", 11, TensorType::Q3_K, true},  {"Q3_K_M", 12, TensorType::Q3_K, true},
      {"Q3_K_L", 13, TensorType::Q3_K, true},  {"Q4_K_S", 14, TensorType::Q4_K, true},
      {"Q4_K_M", 15, TensorType::Q4_K, true},  {"Q5_K_S", 16, TensorType::Q5_K, true},
      {"Q5_K_M", 17, TensorType::Q5_K, true},  {"Q6_K", 18, TensorType::Q6_K, true},
      {"MXFP4_MOE", 38, TensorType::MXFP4, false},
      // llama_ftype_get_default_type: IQ2_S and IQ3_XS are mostly a smaller type than
      // their names say, IQ3_M mostly IQ3_S.
      {"IQ2_XXS", 19, TensorType::IQ2_XXS, true}, {"IQ2_XS", 20, TensorType::IQ2_XS, true},
      {"IQ3_XS", 22, TensorType::IQ3_S, true},    {"IQ3_XXS", 23, TensorType::IQ3_XXS, true},
      {"IQ1_S", 24, TensorType::IQ1_S, true},     {"IQ4_NL", 25, TensorType::IQ4_NL, true},
      {"IQ3_S", 26, TensorType::IQ3_S, true},     {"IQ3_M", 27, TensorType::IQ3_S, true},
      {"IQ2_S", 28, TensorType::IQ2_XS, true},    {"IQ2_M", 29, TensorType::IQ2_S, true},
      {"IQ4_XS", 30, TensorType::IQ4_XS, true},   {"IQ1_M", 31, TensorType::IQ1_M, true},
      {"TQ1_0", 36, TensorType::TQ1_0, true},     {"TQ2_0", 37, TensorType::TQ2_0, true},
  };
  for (const Want& w : want) {
    const Preset* p = find_preset(w.name);
    ASSERT_NE(p, nullptr) << w.name;
    EXPECT_EQ(p->name, w.name);
    EXPECT_EQ(uint32_t(p->file_type), w.file_type) << w.name;
    EXPECT_EQ(p->base_type, w.base) << w.name;
    EXPECT_EQ(p->llama_mix, w.mix) << w.name;
    EXPECT_NE(preset_names().find(w.name), std::string::npos) << w.name;
  }
  EXPECT_EQ(find_preset("q4_k_m"), find_preset("Q4_K_M"));
  EXPECT_EQ(find_preset("q6_k"), find_preset("Q6_K"));
  // llama-quantize's aliases for the medium mixes.
  EXPECT_EQ(find_preset("Q3_K"), find_preset("Q3_K_M"));
  EXPECT_EQ(find_preset("q4_k"), find_preset("Q4_K_M"));
  EXPECT_EQ(find_preset("Q5_K"), find_preset("Q5_K_M"));
  EXPECT_EQ(find_preset("mxfp4_moe"), find_preset("MXFP4_MOE"));
  for (const char* bad : {"Q7_7", "Q8_K", "F16", "Q2_K_S", "IQ2_XS_", "IQ3_K", "", "Q4_K_MM", "MXFP4"})
    EXPECT_EQ(find_preset(bad), nullptr) << bad;
}

// ---------------------------------------------------------------- rules

// A llama model's tensors as kiln-gen writes them (token_embd, output_norm, output, then
// each layer in file order), with the given widths.
std::vector<TensorDesc> llama_tensors(uint32_t n_layers, uint64_t dim, uint64_t kv_dim, uint64_t ffn, bool tied,
                                      uint64_t n_vocab = 512) {
  std::vector<TensorDesc> t;
  t.push_back({"token_embd.weight", {dim, n_vocab}, TensorType::F16});
  t.push_back({"output_norm.weight", {dim}, TensorType::F32});
  if (!tied) t.push_back({"output.weight", {dim, n_vocab}, TensorType::F16});
  for (uint32_t l = 0; l < n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", {dim}, TensorType::F32});
    t.push_back({b + "attn_q.weight", {dim, dim}, TensorType::F16});
    t.push_back({b + "attn_k.weight", {dim, kv_dim}, TensorType::F16});
    t.push_back({b + "attn_v.weight", {dim, kv_dim}, TensorType::F16});
    t.push_back({b + "attn_output.weight", {dim, dim}, TensorType::F16});
    t.push_back({b + "ffn_norm.weight", {dim}, TensorType::F32});
    t.push_back({b + "ffn_gate.weight", {dim, ffn}, TensorType::F16});
    t.push_back({b + "ffn_down.weight", {ffn, dim}, TensorType::F16});
    t.push_back({b + "ffn_up.weight", {dim, ffn}, TensorType::F16});
  }
  return t;
}

ModelFacts llama_facts(uint32_t n_layers, uint32_t heads, uint32_t kv_heads) {
  return {"llama", n_layers, heads, kv_heads, 0};
}

std::map<std::string, TensorType> by_name(const std::vector<TensorDesc>& t, const std::vector<TypeChoice>& c) {
  std::map<std::string, TensorType> m;
  for (size_t i = 0; i < t.size(); ++i) m[t[i].name] = c[i].type;
  return m;
}

// Layers whose `suffix` tensor got `type`.
std::vector<int> layers_with(const std::map<std::string, TensorType>& m, const std::string& suffix, TensorType type) {
  std::vector<int> layers;
  for (const auto& [name, t] : m) {
    int layer = -1;
    if (t == type && name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        std::sscanf(name.c_str(), "blk.%d.", &layer) == 1)
      layers.push_back(layer);
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

// llama-quantize numbers attn_v/ffn_down by its own visiting order (layer number, then
// name), not by file order or string order ("blk.10" < "blk.2"): the same choices for any
// order of the tensor table.
TEST(QuantizeMix, LayerPositionsComeFromLayerNumbersNotFileOrder) {
  const auto tensors = llama_tensors(16, 256, 64, 256, false);
  const auto facts = llama_facts(16, 4, 1);
  const Preset& q4km = *find_preset("Q4_K_M");
  const auto want = by_name(tensors, choose_types(q4km, facts, tensors));
  // use_more_bits for 16 layers: i < 2, i >= 14, (i - 2) % 3 == 2.
  const std::vector<int> more_bits = {0, 1, 4, 7, 10, 13, 14, 15};
  EXPECT_EQ(layers_with(want, ".attn_v.weight", TensorType::Q6_K), more_bits);
  EXPECT_EQ(layers_with(want, ".ffn_down.weight", TensorType::Q6_K), more_bits);

  std::mt19937 rng(3);
  for (int round = 0; round < 5; ++round) {
    auto shuffled = tensors;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    EXPECT_EQ(by_name(shuffled, choose_types(q4km, facts, shuffled)), want) << "round " << round;
  }
}

TEST(QuantizeMix, MediumAndSmallMixesPromoteByPosition) {
  const auto tensors = llama_tensors(16, 256, 64, 256, false);
  const auto facts = llama_facts(16, 4, 1);
  auto types = [&](const char* preset) { return by_name(tensors, choose_types(*find_preset(preset), facts, tensors)); };
  const auto q3m = types("Q3_K_M");
  EXPECT_EQ(layers_with(q3m, ".attn_v.weight", TensorType::Q5_K), (std::vector<int>{0, 1}));
  EXPECT_EQ(layers_with(q3m, ".ffn_down.weight", TensorType::Q5_K), (std::vector<int>{0}));  // i < 16/16
  EXPECT_EQ(layers_with(q3m, ".ffn_down.weight", TensorType::Q4_K).size(), 15u);
  EXPECT_EQ(layers_with(q3m, ".attn_output.weight", TensorType::Q4_K).size(), 16u);
  const auto q4s = types("Q4_K_S");
  EXPECT_EQ(layers_with(q4s, ".attn_v.weight", TensorType::Q5_K), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(layers_with(q4s, ".ffn_down.weight", TensorType::Q5_K), (std::vector<int>{0, 1}));  // i < 16/8
  for (const char* p : {"Q4_K_M", "Q3_K_S", "Q5_K_S", "Q6_K"}) {
    EXPECT_EQ(types(p).at("output.weight"), TensorType::Q6_K) << p;
    EXPECT_EQ(types(p).at("token_embd.weight"), find_preset(p)->base_type) << p << ": untied embeddings";
  }
}

TEST(QuantizeMix, GroupedQueryAttentionDecidesQ2KValueMatrices) {
  const Preset& q2k = *find_preset("Q2_K");
  for (uint32_t kv_heads : {1u, 2u, 4u, 8u}) {
    const auto tensors = llama_tensors(4, 256, 256 / 8 * kv_heads, 256, false);
    const auto m = by_name(tensors, choose_types(q2k, llama_facts(4, 8, kv_heads), tensors));
    const TensorType want = 8 / kv_heads >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
    EXPECT_EQ(layers_with(m, ".attn_v.weight", want).size(), 4u) << "kv heads " << kv_heads;
    EXPECT_EQ(layers_with(m, ".ffn_down.weight", TensorType::Q3_K).size(), 4u);
    EXPECT_EQ(layers_with(m, ".attn_output.weight", TensorType::Q3_K).size(), 4u);
    EXPECT_EQ(layers_with(m, ".attn_q.weight", TensorType::Q2_K).size(), 4u);
  }
}

// llama.cpp calls an 80-layer llama with grouped-query attention a 70B and gives its
// (8x smaller) value matrices Q5_K instead of Q3_K/Q4_K; an 80-layer llama without GQA
// (LLaMA-1 65B) keeps them.
TEST(QuantizeMix, SeventyBModelsGetQ5KValueMatrices) {
  const auto tensors = llama_tensors(80, 256, 256, 256, false);
  for (const char* preset : {"Q3_K_S", "Q3_K_M", "Q4_K_S", "Q2_K"}) {
    const Preset& p = *find_preset(preset);
    const auto gqa = by_name(tensors, choose_types(p, llama_facts(80, 8, 1), tensors));
    EXPECT_EQ(layers_with(gqa, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
    const auto mha = by_name(tensors, choose_types(p, llama_facts(80, 8, 8), tensors));
    EXPECT_LT(layers_with(mha, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
    // Qwen2 calls every 80-layer model 72B; other families have no such size.
    const auto qwen2 = by_name(tensors, choose_types(p, {"qwen2", 80, 8, 8, 0}, tensors));
    EXPECT_EQ(layers_with(qwen2, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
    const auto qwen3 = by_name(tensors, choose_types(p, {"qwen3", 80, 8, 1, 0}, tensors));
    EXPECT_LT(layers_with(qwen3, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
  }
}

TEST(QuantizeMix, RowLengthFallbacks) {
  // Rows of 64: each K type has its smaller-block stand-in; rows of 100 fit none: F16.
  struct Case {
    const char* preset;
    uint64_t row;
    TensorType want;
  };
  const Case cases[] = {{"Q2_K", 64, TensorType::Q4_0},   {"Q3_K_S", 64, TensorType::Q4_0},
                        {"Q4_K_S", 64, TensorType::Q5_0}, {"Q5_K_S", 64, TensorType::Q5_1},
                        {"Q6_K", 64, TensorType::Q8_0},   {"Q4_K_M", 100, TensorType::F16},
                        {"Q4_K_M", 512, TensorType::Q4_K}};
  for (const Case& c : cases) {
    const std::vector<TensorDesc> t = {{"output.weight", {256, 512}, TensorType::F32},
                                       {"blk.0.attn_q.weight", {c.row, 256}, TensorType::F32}};
    const auto choices = choose_types(*find_preset(c.preset), llama_facts(1, 4, 4), t);
    EXPECT_EQ(choices[1].type, c.want) << c.preset << " row " << c.row;
    EXPECT_EQ(choices[1].fell_back, c.row != 512) << c.preset;
    if (c.row != 512) {
      EXPECT_NE(choices[1].note.find("rows of " + std::to_string(c.row)), std::string::npos);
    }
  }
  // The output projection picks Q8_0 itself when its rows are not whole 256-blocks.
  const std::vector<TensorDesc> t = {{"output.weight", {64, 512}, TensorType::F32}};
  EXPECT_EQ(choose_types(*find_preset("Q4_K_M"), llama_facts(1, 4, 4), t)[0].type, TensorType::Q8_0);
}

TEST(QuantizeMix, OnlyWeightMatricesAreQuantized) {
  const std::vector<TensorDesc> t = {
      {"output_norm.weight", {256}, TensorType::F32},
      {"blk.0.attn_q.weight", {256, 1}, TensorType::F32},       // 1-D once trailing 1s go
      {"blk.0.extra_norm.weight", {256, 256}, TensorType::F32},  // a norm, even if 2-D
      {"position_embd.weight", {256, 256}, TensorType::F32},
      {"blk.0.ffn_gate_inp.weight", {256, 8}, TensorType::F32},
      {"blk.0.attn_q.bias", {256, 256}, TensorType::F32},        // not a weight
      {"blk.0.attn_q.weight", {256, 256}, TensorType::BF16},
  };
  const auto c = choose_types(*find_preset("Q4_K_M"), llama_facts(1, 4, 4), t);
  for (size_t i = 0; i + 1 < t.size(); ++i) EXPECT_EQ(c[i].type, t[i].type) << t[i].name;
  EXPECT_EQ(c.back().type, TensorType::Q4_K);
}

TEST(QuantizeMix, RefusesWhatLlamaQuantizeRefuses) {
  const Preset& q4km = *find_preset("Q4_K_M");
  // Output rows of 72: Q8_0 by the output rule, and Q8_0 has no fallback in llama.cpp.
  const std::vector<TensorDesc> odd = {{"output.weight", {72, 512}, TensorType::F32}};
  try {
    choose_types(q4km, llama_facts(1, 4, 4), odd);
    ADD_FAILURE() << "rows of 72 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
  const auto tensors = llama_tensors(2, 256, 256, 256, false);
  EXPECT_THROW(choose_types(q4km, {"falcon", 2, 4, 4, 0}, tensors), Error);  // not a family kiln runs
  // The legacy presets keep kiln's own rule and never refuse.
  EXPECT_NO_THROW(choose_types(*find_preset("Q8_0"), {"gemma", 2, 4, 4, 8}, odd));
}

// With experts, an ffn_down matrix's layer comes from its name, not from how many came
// before: a layer with a shared expert beside the routed ones has two, and both take the
// layer's rule (llama-quantize's layer_info). The tables of quant_llama_tables_test.cpp
// cannot show this (kiln runs no family with shared experts yet).
TEST(QuantizeMix, ExpertFfnDownTakesItsLayerFromTheName) {
  std::vector<TensorDesc> t;
  const int n_layers = 16;
  for (int l = n_layers - 1; l >= 0; --l) {  // reversed on purpose: the visit order sorts by layer
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "ffn_down_exps.weight", {256, 256, 4}, TensorType::F16});
    t.push_back({b + "ffn_down_shexp.weight", {256, 256}, TensorType::F16});
  }
  const ModelFacts moe{"qwen3moe", uint32_t(n_layers), 8, 4, 4};
  const auto c = choose_types(*find_preset("Q4_K_M"), moe, t);
  for (size_t i = 0; i < t.size(); ++i) {
    int layer = -1;
    std::sscanf(t[i].name.c_str(), "blk.%d.", &layer);
    const bool more = layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
    EXPECT_EQ(c[i].type, more ? TensorType::Q6_K : TensorType::Q4_K) << t[i].name;
  }
  // Counted one by one instead (a dense model), the second matrix of layer 0 would be
  // position 1 and layer 15's pair positions 30 and 31 of 16.
  const auto dense = choose_types(*find_preset("Q4_K_M"), {"qwen3moe", uint32_t(n_layers), 8, 4, 0}, t);
  size_t differ = 0;
  for (size_t i = 0; i < t.size(); ++i) differ += dense[i].type != c[i].type;
  EXPECT_GT(differ, 0u);

  t.push_back({"shared_ffn_down.weight", {256, 256}, TensorType::F16});
  try {
    choose_types(*find_preset("Q4_K_M"), moe, t);
    ADD_FAILURE() << "an expert model's ffn_down without a layer number accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared_ffn_down.weight"), std::string::npos) << e.what();
  }
}

TEST(QuantizeMix, LegacyPresetsQuantizeEveryMatrixThatFits) {
  const auto tensors = llama_tensors(2, 64, 32, 172, false);
  const auto c = choose_types(*find_preset("Q4_0"), {}, tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    if (t.dims.size() == 1) {
      EXPECT_EQ(c[i].type, t.type) << t.name;
    } else if (t.dims[0] == 172) {  // ffn_down: rows of 172 are not whole 32-blocks
      EXPECT_EQ(c[i].type, t.type) << t.name;
      EXPECT_TRUE(c[i].fell_back) << t.name;
    } else {
      // The output projection (rows of 64: not whole Q6_K super-blocks) gets Q8_0, as
      // llama-quantize gives it.
      EXPECT_EQ(c[i].type, t.name == "output.weight" ? TensorType::Q8_0 : TensorType::Q4_0) << t.name;
    }
  }
}

// MXFP4_MOE follows llama-quantize's shape rule, not names: a stacked matrix of more than
// one expert (third dimension > 1) gets MXFP4, every other quantizable matrix Q8_0 (the
// output and the router excepted as in every preset), whatever the architecture; rows that
// are not whole 32-value blocks are refused with the tensor's name, as llama-quantize has
// no fallback for MXFP4 or Q8_0. (Whole models: quant_llama_tables_test.cpp.)
TEST(QuantizeMix, Mxfp4MoeGivesExpertsMxfp4AndTheRestQ8_0) {
  const std::vector<TensorDesc> t = {
      {"token_embd.weight", {64, 512}, TensorType::F16},
      {"output.weight", {64, 512}, TensorType::F16},
      {"output_norm.weight", {64}, TensorType::F32},
      {"blk.0.attn_q.weight", {64, 64}, TensorType::F16},
      {"blk.0.ffn_gate_inp.weight", {64, 4}, TensorType::F32},
      {"blk.0.ffn_up_exps.weight", {64, 96, 4}, TensorType::F16},
      {"blk.0.ffn_down_exps.weight", {96, 64, 4}, TensorType::BF16},
      {"blk.0.ffn_down_exps_one.weight", {96, 64, 1}, TensorType::F16},  // one expert: not stacked
      {"blk.0.ffn_up_shexp.weight", {64, 96}, TensorType::F16},
  };
  const TensorType want[] = {TensorType::Q8_0, TensorType::Q8_0, TensorType::F32, TensorType::Q8_0, TensorType::F32,
                             TensorType::MXFP4, TensorType::MXFP4, TensorType::Q8_0, TensorType::Q8_0};
  for (const ModelFacts& facts : {ModelFacts{"qwen3moe", 1, 4, 2, 4}, ModelFacts{"gpt-oss", 1, 4, 2, 4}, ModelFacts{}}) {
    const auto c = choose_types(*find_preset("MXFP4_MOE"), facts, t);
    ASSERT_EQ(c.size(), t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_EQ(c[i].type, want[i]) << facts.arch << " " << t[i].name;
      EXPECT_FALSE(c[i].fell_back) << t[i].name;
    }
  }
  for (const TensorDesc& odd : {TensorDesc{"blk.3.ffn_down_exps.weight", {48, 64, 8}, TensorType::F16},
                                TensorDesc{"blk.3.attn_k.weight", {48, 64}, TensorType::F16}}) {
    try {
      choose_types(*find_preset("MXFP4_MOE"), {"qwen3moe", 4, 4, 2, 8}, {odd});
      ADD_FAILURE() << odd.name << ": rows of 48 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(odd.name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rows of 48"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::quantize
