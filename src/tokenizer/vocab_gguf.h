#pragma once
// A Vocab as GGUF metadata, for files kiln writes (llama2.c conversions, generated
// models whose vocabulary comes from a tokenizer.json or tokenizer.model).
#include <string>

#include "kiln/gguf.h"
#include "kiln/tokenizer.h"

namespace kiln {

// The tokenizer.ggml.* keys Vocab::from_gguf reads back as `v` (a pre-tokenizer without
// a GGUF name, "tokenizer.json", is left out).
void write_vocab_gguf(gguf::Writer& w, const Vocab& v);

// A SentencePiece-BPE vocabulary that a tokenizer.json states with merges (Gemma's), with
// the scores a GGUF "llama" vocabulary merges by instead: minus the rank of the first
// merge making each token (spm_scores.cpp says why that is exact, and checks it). Throws
// kiln::Error, naming `origin`, when the merges are not such a restatement.
Vocab spm_vocab_from_merges(const Vocab& vocab, const std::string& origin);

// Whether BOS is added when a file does not say: llama.cpp's rule, by tokenizer.ggml.model
// and tokenizer.ggml.pre (Llama 3's BPE adds it, other BPE vocabularies do not).
bool default_add_bos(const std::string& model, const std::string& pre);

}  // namespace kiln
