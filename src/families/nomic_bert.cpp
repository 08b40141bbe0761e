// nomic-bert (nomic-embed-text v1/v1.5): BERT's encoder (src/families/bert.cpp) with
// rotary positions instead of a learned table (rope.freq_base, NEOX halves, as llama.cpp
// rotates it), one fused attn_qkv matrix, and a SwiGLU FFN (ffn_gate, ffn_up, ffn_down)
// without biases. Mean pooling in nomic's files (pooling_type 1).
#include "families/architecture.h"

namespace kiln {

void load_nomic_bert(Model& model) { read_bert_encoder(model, {.rope = true, .swiglu = true}); }

}  // namespace kiln
