// Gemma 3 (text): Gemma 2's block with a per-head RMSNorm on Q and K (attn_q_norm /
// attn_k_norm) instead of the attention soft-cap, five local layers per global one
// (sliding_window_pattern 6) when the file states a window, and two RoPE settings: global
// layers use rope.freq_base (1M) with the file's scaling (linear x8 on 4B and up), local
// layers rope.freq_base_swa (10000) unscaled. Final soft-capping only if the file asks.
#include "families/architecture.h"

namespace kiln {

void load_gemma3(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_gemma(model, {.qk_norm = true, .post_norms = true});
  read_sliding_window(f, p, c, /*default_window=*/0, /*default_pattern=*/6);
  if (!c.swa_window.empty()) c.rope_theta_swa = (float)f.get_float(p + "rope.freq_base_swa", 10000.0);
  c.final_softcap = (float)f.get_float(p + "final_logit_softcapping", 0.0);
  gemma_query_scale(c, 62);
}

}  // namespace kiln
