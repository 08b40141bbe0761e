#pragma once
// Reads a tokenizer.json without building a JSON tree for its two big parts: the
// vocabulary (up to ~260K entries) and the merges (up to ~500K) are streamed straight
// into vectors, which makes loading several times faster than a full parse.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

struct HfJsonDocument {
  nlohmann::json rest;  // the whole file except model.vocab and model.merges
  bool has_vocab = false;  // model.vocab was an object
  std::vector<std::pair<std::string, int64_t>> vocab;
  // Merges ("a b" or ["a", "b"]) as both parts back to back in one buffer, with where
  // each part ends: half a million small strings would cost more than the parse.
  std::string merge_chars;
  std::vector<uint32_t> merge_ends;  // two per merge
  std::vector<std::pair<std::string_view, std::string_view>> merges() const;
};

// Throws kiln::Error (prefixed with `origin`) for invalid JSON or a vocabulary or merge
// entry of the wrong shape.
HfJsonDocument read_hf_json(const std::string& text, const std::string& origin);

}  // namespace kiln
