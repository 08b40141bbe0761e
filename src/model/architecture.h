#pragma once
// The registry of model families. Each family's file (src/models/<arch>.cpp) reads its
// hyperparameters and tensors into the shared ModelConfig / LayerWeights shape; nothing
// else in kiln switches on an architecture's name.
#include <string>
#include <vector>

#include "kiln/model.h"

namespace kiln {

struct Architecture {
  const char* name;  // general.architecture
  void (*load)(Model& model);
};

const Architecture* find_architecture(const std::string& name);
std::vector<std::string> architecture_names();

// Architectures (one line each in src/models/registry.cpp).
void load_llama(Model& model);

}  // namespace kiln
