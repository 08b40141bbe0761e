// kiln quantize IN.gguf OUT.gguf TYPE: rewrites a float model with quantized weights.
// Matrices whose rows are not whole blocks of TYPE keep their type (as llama.cpp falls
// back for them); norms and other 1-D tensors stay F32.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>

#include "cli/common.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kiln/error.h"
#include "kiln/gguf.h"

namespace kiln::cli {
namespace {

struct QuantizeOptions {
  LogOptions log;
  std::string input, output, type;
};

// llama.cpp's general.file_type values, so other tools name the file's type correctly.
uint32_t file_type_of(TensorType t) {
  switch (t) {
    case TensorType::Q4_0: return 2;
    case TensorType::Q4_1: return 3;
    case TensorType::Q8_0: return 7;
    case TensorType::Q5_0: return 8;
    case TensorType::Q5_1: return 9;
    default: return 0;
  }
}

std::vector<float> to_f32(const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements);
  const auto* h = reinterpret_cast<const uint16_t*>(t.data);
  switch (t.type) {
    case TensorType::F32: std::memcpy(out.data(), t.data, t.n_bytes); break;
    case TensorType::F16: kernels::ops().fp16_to_f32(h, out.data(), out.size()); break;
    case TensorType::BF16: kernels::ops().bf16_to_f32(h, out.data(), out.size()); break;
    default: throw Error("tensor '" + t.name + "' is " + type_name(t.type) + "; quantize from an F32, F16 or BF16 model");
  }
  return out;
}

int quantize(QuantizeOptions& o) {
  setup_logging(o.log);
  const auto target = type_from_name(o.type);
  const kernels::ref::QuantTraits* q = target ? kernels::ref::quant_traits(*target) : nullptr;
  if (!q || !q->can_quantize || *target == TensorType::Q8_K)
    throw UsageError("cannot quantize to '" + o.type + "' (supported: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)");
  auto in = gguf::File::open(o.input);

  gguf::Writer w;
  for (const auto& [key, value] : in->metadata())
    if (key != "general.alignment") w.set(key, value);
  w.set("general.file_type", gguf::Value::of_u32(file_type_of(*target)));

  const size_t n = in->tensors().size();
  size_t i = 0, quantized = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  for (const gguf::TensorInfo& t : in->tensors()) {
    ++i;
    bytes_in += t.n_bytes;
    const bool matrix = t.dims.size() == 2;
    if (!matrix || t.dims[0] % q->block_size != 0) {
      if (matrix) spdlog::info("[{}/{}] {}: rows of {} are not whole {} blocks, kept as {}", i, n, t.name, t.dims[0], q->name, type_name(t.type));
      w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
      bytes_out += t.n_bytes;
      continue;
    }
    const std::vector<float> values = to_f32(t);
    std::vector<uint8_t> blocks(t.n_elements / q->block_size * q->block_bytes);
    kernels::ref::quantize_row(*target, values.data(), blocks.data(), values.size());
    spdlog::info("[{}/{}] {}: {} -> {}", i, n, t.name, type_name(t.type), q->name);
    bytes_out += blocks.size();
    w.add_tensor(t.name, *target, t.dims, std::move(blocks));
    ++quantized;
  }
  w.write(o.output);
  spdlog::info("kiln: wrote {}: {} of {} tensors quantized to {}, {:.2f} MiB -> {:.2f} MiB", o.output, quantized, n,
               q->name, bytes_in / 1048576.0, bytes_out / 1048576.0);
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app, Action& action) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write a copy of a float model with quantized weights");
  cmd->add_option("input", o->input, "F32/F16/BF16 model (GGUF)")->required();
  cmd->add_option("output", o->output, "Output file")->required();
  cmd->add_option("type", o->type, "Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1")->required();
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return quantize(*o); }; });
}

}  // namespace kiln::cli
