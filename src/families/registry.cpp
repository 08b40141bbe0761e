#include "families/architecture.h"

namespace kiln {
namespace {

constexpr Architecture kArchitectures[] = {
    {"llama", load_llama},
    {"qwen2", load_qwen2},
    {"qwen3", load_qwen3},
    {"qwen3moe", load_qwen3moe},
    {"gemma", load_gemma},
    {"gemma2", load_gemma2},
    {"gemma3", load_gemma3},
    {"phi3", load_phi3},
    {"mpt", load_mpt},
    {"gpt-oss", load_gpt_oss},
    {"mamba2", load_mamba2},
    {"granitehybrid", load_granite_hybrid},
    {"bert", load_bert},
    {"nomic-bert", load_nomic_bert},
};

}  // namespace

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : kArchitectures)
    if (name == a.name) return &a;
  return nullptr;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.push_back(a.name);
  return names;
}

}  // namespace kiln
