// Gemma 2: Gemma's block with an RMSNorm on each sublayer's output before its residual
// (post_attention_norm, post_ffw_norm), local sliding-window layers alternating with
// global ones (window 4096 and every 2nd layer global unless the file says otherwise),
// and soft-capping, cap * tanh(x / cap), of the attention scores (attn_logit_softcapping,
// 50) and of the final logits (final_logit_softcapping, 30).
#include "families/architecture.h"

namespace kiln {

void load_gemma2(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_gemma(model, {.post_norms = true});
  read_sliding_window(f, p, c, /*default_window=*/4096, /*default_pattern=*/2);
  // Local layers may rotate with their own base; by default they share the global one.
  c.rope_theta_swa = (float)f.get_float(p + "rope.freq_base_swa", 0.0);
  c.attn_softcap = (float)f.get_float(p + "attn_logit_softcapping", 50.0);
  c.final_softcap = (float)f.get_float(p + "final_logit_softcapping", 30.0);
  gemma_query_scale(c, 46);
}

}  // namespace kiln
