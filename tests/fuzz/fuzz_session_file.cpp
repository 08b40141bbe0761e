// Session files (kiln/session_file.h) loaded into a live session of stories260K.
// Input: [mode] file bytes. Mode bits 0-1 pick the session's KV cache (f16; f32; q8_0
// keys and values with tiled attention), so files saved by each kind of session get
// past the layout check. Bit 2 rewrites both checksums to match the mutated bytes first:
// without it nearly every mutation stops at a checksum, and the checks behind them (sizes,
// token ids, KV layout) would never see hostile values.
#include <cstdint>
#include <cstring>
#include <memory>

#include "fuzz_util.h"
#include "kiln/error.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "kiln/session_file.h"
#include "util/hash64.h"

namespace {

const kiln::Model& model() {
  static std::unique_ptr<kiln::Model> m = kiln::Model::load(kiln::fuzz::shared_dir() + "/models/stories260K.gguf");
  return *m;
}

kiln::Session& session(int kind) {
  static std::unique_ptr<kiln::Session> sessions[3];
  if (!sessions[kind]) {
    kiln::SessionParams p;
    p.n_ctx = 128;
    p.n_threads = 1;
    if (kind == 1) p.kv_type_k = p.kv_type_v = kiln::TensorType::F32;
    if (kind == 2) {
      p.kv_type_k = p.kv_type_v = kiln::TensorType::Q8_0;
      p.flash_attn = kiln::FlashAttention::on;
    }
    sessions[kind] = std::make_unique<kiln::Session>(model(), p);
  }
  return *sessions[kind];
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (int k = 0; k < 3; ++k) session(k);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> bytes(data + 1, data + size);
  constexpr size_t kHeader = 96;
  if ((mode & 4) && bytes.size() >= kHeader) {
    const uint64_t payload = kiln::Hash64::of(bytes.data() + kHeader, bytes.size() - kHeader);
    std::memcpy(bytes.data() + 72, &payload, 8);
    const uint64_t header = kiln::Hash64::of(bytes.data(), 88);
    std::memcpy(bytes.data() + 88, &header, 8);
  }
  kiln::Session& s = session((mode & 3) % 3);
  s.reset();
  kiln::fuzz::MemFile file(bytes.data(), bytes.size());
  try {
    (void)kiln::read_session_file_info(file.path());
    const kiln::LoadedSession loaded = kiln::load_session_file(file.path(), s);
    if (s.n_past() != loaded.info.n_cached) __builtin_trap();
    // A loaded session must go on like any other.
    if (s.n_past() < s.n_ctx()) {
      const int32_t next = loaded.tokens.empty() ? 1 : loaded.tokens.back();
      s.decode(std::span(&next, 1));
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
