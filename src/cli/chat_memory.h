#pragma once
// `kiln chat --memory FILE.db`: what the user says is kept in a MemoryStore (each user
// turn, and facts given with /remember), and before every turn the memories most relevant
// to the new message join the system prompt under a short heading. With --embed-model the
// memories and each message are embedded too, and recall fuses BM25 with cosine similarity.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/embedding.h"
#include "kiln/memory.h"
#include "kiln/model.h"

namespace kiln::cli {

struct ChatMemoryOptions {
  std::string file;         // --memory; empty: no memory
  int32_t k = 3;            // --memory-k
  std::string embed_model;  // --embed-model
};

// A memory id as typed ("12": a positive integer, nothing after it); nullopt otherwise.
// `kiln memory FILE forget ID` and the chat's /forget ID.
std::optional<int64_t> parse_memory_id(const std::string& text);

// The system prompt a turn renders: the user's own, then the recalled memories.
std::string memory_system_prompt(const std::string& base, const std::vector<MemoryHit>& hits);

class ChatMemory {
 public:
  // Opens the store (kiln::Error naming the file when it is refused) and the embedding
  // model when one is given. `conversation` tags what this chat remembers.
  ChatMemory(const ChatMemoryOptions& options, std::string conversation, int32_t n_threads);
  ~ChatMemory();

  // Before a turn on user_text: recalls up to k memories (not this run's own turns, which
  // the conversation already holds) and sets chat's system prompt to the base prompt plus
  // those that fit, in rank order: the conversation rendered with them and the new
  // message must leave reply_reserve of the n_ctx tokens. Returns the ones used.
  std::vector<MemoryHit> recall_into(Chat& chat, const std::string& user_text, size_t n_ctx, size_t reply_reserve);
  // After a turn that went through: the user's message becomes a memory.
  void remember_turn(const std::string& user_text);
  // /remember TEXT: a fact, recalled from this conversation on too. Its id.
  int64_t remember_fact(const std::string& text);
  // What recall would return for text (/memory search).
  std::vector<MemoryHit> search(const std::string& text, int k);

  MemoryStore& store() { return *store_; }
  // The user's own system prompt (--system, /system); recall adds to it.
  std::string base_system;

 private:
  std::vector<float> embed(const std::string& text);

  std::unique_ptr<MemoryStore> store_;
  std::unique_ptr<Model> embed_model_;
  std::unique_ptr<Embedder> embedder_;
  std::string conversation_;
  int32_t k_;
  std::set<int64_t> own_turns_;
};

}  // namespace kiln::cli
