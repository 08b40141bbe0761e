// kiln info MODEL: what is in the file and what running it will need.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/common.h"
#include "kiln/embedding.h"
#include "kiln/error.h"
#include "runtime/kv_cache.h"
#include "runtime/recurrent_state.h"
#include "runtime/rope.h"
#include "runtime/sliding_window.h"

namespace kiln::cli {
namespace {

struct InfoOptions {
  LogOptions log;
  std::string model;
  bool all_metadata = false;
  bool tensors = false;
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

int info(InfoOptions& o) {
  setup_logging(o.log);
  const std::string path = resolve_model_path(o.model);
  auto file = gguf::File::open(path);
  std::printf("file:         %s\n", path.c_str());
  std::printf("gguf:         version %u, %zu metadata keys, %zu tensors, alignment %llu, %s\n", file->version(),
              file->metadata().size(), file->tensors().size(), (unsigned long long)file->alignment(),
              human_bytes((double)file->file_size()).c_str());

  std::map<std::string, std::pair<size_t, uint64_t>> by_type;
  for (const auto& t : file->tensors()) {
    auto& [count, bytes] = by_type[type_name(t.type)];
    ++count;
    bytes += t.n_bytes;
  }
  std::string types;
  for (const auto& [name, cb] : by_type)
    types += (types.empty() ? "" : ", ") + name + " x" + std::to_string(cb.first) + " (" + human_bytes((double)cb.second) + ")";
  std::printf("tensor types: %s\n", types.empty() ? "none (vocabulary only)" : types.c_str());

  if (o.all_metadata) {
    std::printf("metadata:\n");
    for (const auto& [key, value] : file->metadata()) std::printf("  %-45s %s\n", key.c_str(), value.to_string().c_str());
  }
  if (o.tensors) {
    std::printf("tensors:\n");
    for (const auto& t : file->tensors()) {
      std::string dims;
      for (auto d : t.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
      std::printf("  %-32s %-6s [%s]\n", t.name.c_str(), type_name(t.type).c_str(), dims.c_str());
    }
  }
  file.reset();

  std::unique_ptr<Model> model;
  try {
    // Only the description is needed: no repacking of the weights.
    LoadParams params;
    params.repack = false;
    model = Model::load(path, params);
  } catch (const Error& e) {
    std::printf("runnable:     no (%s)\n", e.what());
    try {
      auto f = gguf::File::open(path);
      auto tok = Tokenizer::from_gguf(*f);
      std::printf("tokenizer:    %s, %d tokens, bos %d, eos %d\n", tok->vocab().model.c_str(), tok->n_vocab(),
                  tok->bos(), tok->eos());
    } catch (const Error&) {
    }
    return 0;
  }
  const ModelConfig& c = model->config();
  const Tokenizer& tok = model->tokenizer();
  std::printf("name:         %s\n", c.name.c_str());
  std::printf("architecture: %s\n", c.arch.c_str());
  std::printf("parameters:   %.2f M (%s of weights, mostly %s)\n", model->n_params() / 1e6,
              human_bytes((double)model->weight_bytes()).c_str(), type_name(c.weight_type).c_str());
  std::printf("per token:    %s of weights read by each decoded token\n",
              human_bytes((double)model->decode_bytes_per_token()).c_str());
  std::printf("context:      %u (trained)\n", c.n_ctx_train);
  std::printf("layers:       %u, dim %u, ffn %u, heads %u, kv heads %u, head dim %u\n", c.n_layers, c.dim, c.ffn_dim,
              c.n_heads, c.n_kv_heads, c.head_dim);
  size_t n_ssm = 0;
  for (size_t l = 0; l < c.n_layers; ++l) n_ssm += c.is_ssm(l);
  const bool attends = n_ssm < c.n_layers;
  if (n_ssm > 0)
    std::printf("ssm:          Mamba-2 on %zu of %u layers: d_inner %u, d_state %u, %u heads of %u, %u group%s, conv %u\n",
                n_ssm, c.n_layers, c.ssm_d_inner, c.ssm_d_state, c.ssm_n_heads, c.ssm_head_dim(), c.ssm_n_groups,
                c.ssm_n_groups == 1 ? "" : "s", c.ssm_d_conv);
  if (n_ssm > 0 && attends) {
    // Which layers are which, as ranges: "attention on 5, 11; Mamba-2 on 0-4, 6-10".
    const auto ranges = [&](bool ssm) {
      std::string out;
      for (size_t l = 0; l < c.n_layers;) {
        if (c.is_ssm(l) != ssm) { ++l; continue; }
        size_t e = l;
        while (e + 1 < c.n_layers && c.is_ssm(e + 1) == ssm) ++e;
        out += (out.empty() ? "" : ", ") + std::to_string(l) + (e > l ? "-" + std::to_string(e) : "");
        l = e + 1;
      }
      return out;
    };
    std::printf("mixers:       attention on %s; Mamba-2 on %s\n", ranges(false).c_str(), ranges(true).c_str());
  }
  if (!attends) {
  } else if (c.positions == Positions::none) {
    std::printf("positions:    none (NoPE attention)\n");
  } else if (c.positions == Positions::alibi) {
    std::printf("positions:    ALiBi, max bias %g\n", c.max_alibi_bias);
  } else if (c.positions == Positions::learned) {
    std::printf("positions:    learned (position_embd, %llu)\n", (unsigned long long)model->pos_embd.rows);
  } else {
    std::string scaling;
    try {
      scaling = describe_rope(resolve_rope(c, {}));
    } catch (const Error& e) {
      scaling = std::string("unusable (") + e.what() + ")";
    }
    std::printf("rope:         %u dims, theta %g, %s, scaling %s\n", c.n_rot, c.rope_theta,
                c.rope_neox ? "neox" : "normal", scaling.c_str());
  }
  if (c.norm == Norm::layer) std::printf("layernorm:    eps %g\n", c.rms_eps);
  else std::printf("rms eps:      %g\n", c.rms_eps);
  if (!model->layers[0].ffn_norm && !model->layers[0].w_down)
    std::printf("ffn:          none");
  else if (c.ffn == Ffn::swiglu_clamped)
    std::printf("ffn:          SwiGLU clamped at %g, alpha %g, up + 1", c.swiglu_limit, c.swiglu_alpha);
  else
    std::printf("ffn:          %s", c.ffn == Ffn::gelu ? "GELU MLP" : c.ffn == Ffn::geglu ? "GeGLU" : "SwiGLU");
  if (c.n_experts > 0)
    std::printf(", mixture of %u experts (%u used per token, width %u%s%s)", c.n_experts, c.n_experts_used,
                c.expert_ffn_dim,
                c.expert_softmax_chosen ? ", softmax over the chosen"
                : c.expert_weights_norm ? ", weights renormalized" : "",
                model->layers[0].gate_exps_b ? ", biases" : "");
  if (c.shared_expert_ffn_dim > 0) std::printf(" + a shared expert of width %u", c.shared_expert_ffn_dim);
  std::printf("\n");
  if (c.clamp_kqv > 0) std::printf("clamp_kqv:    %g\n", c.clamp_kqv);
  // What sets the family apart from a plain Llama block, as the loader found it.
  std::vector<std::string> parts;
  const LayerWeights& L0 = model->layers[0];
  if (L0.bq && c.norm == Norm::rms) parts.push_back("Q/K/V biases");
  if (L0.q_norm) parts.push_back(L0.q_norm.cols == c.head_dim ? "per-head Q/K RMSNorm" : "Q/K norms over the whole row");
  if (L0.attn_post_norm) parts.push_back("post-norms");
  if (L0.attn_out_norm) parts.push_back("norms after the residual sums (post-norm blocks)");
  if (!c.causal) parts.push_back("non-causal attention");
  if (model->token_types) parts.push_back("token type embeddings");
  if (L0.attn_sinks) parts.push_back("attention sinks");
  if (L0.wq && L0.wq.info == L0.wk.info) parts.push_back("fused QKV");  // row ranges of one tensor
  if (L0.w_gate && L0.w_gate.info == L0.w_up.info) parts.push_back("fused gate/up");
  char buf[96];
  if (c.embed_scale != 1) std::snprintf(buf, sizeof buf, "embeddings x%g", c.embed_scale), parts.push_back(buf);
  if (c.residual_scale != 1) std::snprintf(buf, sizeof buf, "residual x%g", c.residual_scale), parts.push_back(buf);
  if (c.logit_scale != 1) std::snprintf(buf, sizeof buf, "logits /%g", c.logit_scale), parts.push_back(buf);
  if (c.attn_scale > 0) std::snprintf(buf, sizeof buf, "query scale %g", c.attn_scale), parts.push_back(buf);
  if (c.attn_softcap > 0) std::snprintf(buf, sizeof buf, "attention soft-cap %g", c.attn_softcap), parts.push_back(buf);
  if (c.final_softcap > 0) std::snprintf(buf, sizeof buf, "final soft-cap %g", c.final_softcap), parts.push_back(buf);
  if (c.rope_theta_swa > 0) std::snprintf(buf, sizeof buf, "window layers' RoPE base %g", c.rope_theta_swa), parts.push_back(buf);
  if (!parts.empty()) {
    std::string line;
    for (const std::string& p : parts) line += (line.empty() ? "" : ", ") + p;
    std::printf("features:     %s\n", line.c_str());
  }
  const std::vector<uint32_t> windows = layer_windows(c, {});
  std::vector<uint32_t> cache_windows;  // the cache holds the attention layers only
  for (size_t l = 0; l < windows.size(); ++l)
    if (!c.is_ssm(l)) cache_windows.push_back(windows[l]);
  if (!describe_windows(windows).empty()) std::printf("sliding win:  %s\n", describe_windows(windows).c_str());
  std::printf("output:       %s\n", !model->output                             ? "hidden states (no classifier: kiln embed)"
                               : model->output.data == model->token_embd.data ? "tied to token_embd"
                                                                              : "output.weight");
  if (c.pooling != Pooling::none) std::printf("pooling:      %s (embeddings)\n", pooling_name(c.pooling));
  if (!c.ignored_keys.empty()) {
    std::string keys;
    for (const std::string& k : c.ignored_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("ignored:      %s (metadata kiln's %s does not read)\n", keys.c_str(), c.arch.c_str());
  }
  std::printf("tokenizer:    %s, %d tokens, bos %d, eos %d, add_bos %s\n", tok.vocab().model.c_str(), tok.n_vocab(),
              tok.bos(), tok.eos(), tok.vocab().add_bos ? "yes" : "no");
  const uint32_t n_ctx = uint32_t(SessionParams{}.context_for(c));
  // The cache at the default context for each type -ctk/-ctv can pick (keys and values alike).
  std::string per_type;
  for (TensorType t : {TensorType::F16, TensorType::F32, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0}) {
    // Sliding-window layers as rings at the default batch size (512).
    KvCache::Shape s{c.n_layers - n_ssm, n_ctx, size_t(c.n_kv_heads) * c.head_dim, c.head_dim, t, t,
                     KvCache::is_one_value(t), layer_capacities(cache_windows, n_ctx, std::min<uint32_t>(512, n_ctx), false)};
    if (!KvCache::is_one_value(t) && s.kv_dim % 32 != 0) continue;
    per_type += (per_type.empty() ? "" : ", ") + human_bytes(KvCache::bytes_for(s)) + " " + KvCache::type_label(t);
  }
  // A recurrent layer's state has one size whatever the context.
  const std::string state =
      n_ssm ? " + recurrent state " + human_bytes(double(RecurrentState(c).sequence_bytes())) + " per sequence" : "";
  if (attends)
    std::printf("memory:       %s weights (mapped) + KV cache at context %u: %s%s\n",
                human_bytes((double)model->weight_bytes()).c_str(), n_ctx, per_type.c_str(), state.c_str());
  else
    std::printf("memory:       %s weights (mapped)%s, no KV cache\n", human_bytes((double)model->weight_bytes()).c_str(),
                state.c_str());
  return 0;
}

}  // namespace

void register_info(CLI::App& app, Action& action) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "Show a model's architecture, hyperparameters, tokenizer and tensors");
  cmd->add_option("model", o->model, "Model file (GGUF)");
  cmd->add_flag("-a,--metadata", o->all_metadata, "Print every metadata key");
  cmd->add_flag("--tensors", o->tensors, "Print every tensor");
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return info(*o); }; });
}

}  // namespace kiln::cli
