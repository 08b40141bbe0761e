#pragma once
// Session files: a conversation saved together with its KV cache, so that reopening it
// resumes at once instead of running the whole history through the model again.
//
// Version 1, little-endian, fixed widths:
//    0  char[8]  "KILNSESS"
//    8  u32      version (1)
//   12  u32      header size (96)
//   16  u64      model identity (Model::identity of the model that computed the cache)
//   24  u32      n_ctx of the session that saved it
//   28  u32      n_tokens: the conversation's token history
//   32  u32      n_cached: positions in the KV cache, the first n_cached of those tokens
//   36  u32      KV type (0: f32)      bytes 36..55 and 80: Session::kv_state_desc(n_cached);
//   40  u32      KV layers             what the bytes of a KV type mean is the runtime's
//   44  u32      KV width              business, so a new cache type changes no field
//   48  u64      KV bytes per layer
//   56  u64      app data size
//   64  u64      payload size: 4 * n_tokens + app data size + KV layers * KV bytes per layer
//   72  u64      payload checksum (XXH64 of the payload)
//   80  u64      positions: what the cached keys' RoPE angles follow (KvStateDesc::positions;
//                0 for the model's own, unscaled RoPE)
//   88  u64      header checksum (XXH64 of bytes 0..87)
//   96           payload: i32 tokens[n_tokens], app data, KV state layer after layer, then
//                the recurrent layers' state (KvStateDesc::recurrent_bytes, the model's: none
//                for attention-only models, whose files are as before; also counted in
//                the payload size)
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/session.h"

namespace kiln {

struct SessionFileInfo {
  uint32_t version = 0;
  uint64_t model_identity = 0;
  int32_t n_ctx = 0;     // of the session that saved it
  int32_t n_tokens = 0;  // tokens of the conversation
  int32_t n_cached = 0;  // of those, the positions the saved KV cache holds
};

// Saves `tokens` (the conversation's history; the first session.n_past() of them are the
// ones in the cache, and it may hold more, e.g. a sampled end-of-turn token not decoded
// yet), `app_data` (opaque to kiln: the chat keeps its messages and settings there) and
// the KV cache of session.n_past() positions. Written to PATH.tmp, synced, then renamed
// over PATH, so PATH is always either the old file or the whole new one. Throws
// kiln::Error naming the file on I/O failure, or if tokens has fewer than n_past() ids.
void save_session_file(const std::string& path, const Session& session, std::span<const int32_t> tokens,
                       std::string_view app_data);

struct LoadedSession {
  SessionFileInfo info;
  std::vector<int32_t> tokens;  // tokens[info.n_cached..] are not in the cache yet
  std::string app_data;
};

// Checks the whole file before touching the session: magic, version, model identity
// ("<path>: saved with a different model (...)"), the context it needs ("<path>: needs a
// context of at least N tokens ..."), truncation, checksums ("<path>: corrupted (checksum
// mismatch)"), token ids and KV sizes against this model. Any failure throws one line of
// kiln::Error naming the file and leaves the session as it was, so the caller can start
// clean. On success the session holds the saved positions and n_past() == info.n_cached.
// The payload is read with one fread: a 2,000-token conversation loads in milliseconds.
LoadedSession load_session_file(const std::string& path, Session& session);

// Only the header (magic, version and header checksum checked): enough to create a
// Session with the saved n_ctx, or to compare identities, before load_session_file.
SessionFileInfo read_session_file_info(const std::string& path);

}  // namespace kiln
