#include "cli/chat_memory.h"

#include <algorithm>

#include "cli/common.h"
#include "kiln/error.h"

namespace kiln::cli {

std::optional<int64_t> parse_memory_id(const std::string& text) {
  size_t used = 0;
  int64_t id = -1;
  try {
    id = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || id < 1) return std::nullopt;
  return id;
}

std::string memory_system_prompt(const std::string& base, const std::vector<MemoryHit>& hits) {
  if (hits.empty()) return base;
  std::string text = base;
  if (!text.empty()) text += "\n\n";
  text += "What you remember about the user from earlier conversations:";
  for (const MemoryHit& h : hits) text += "\n- " + h.memory.text;
  return text;
}

ChatMemory::ChatMemory(const ChatMemoryOptions& options, std::string conversation, int32_t n_threads)
    : store_(MemoryStore::open(options.file)), conversation_(std::move(conversation)), k_(options.k) {
  if (options.embed_model.empty()) return;
  embed_model_ = load_model(resolve_model_path(options.embed_model));
  EmbedParams params;
  params.n_threads = n_threads;
  embedder_ = std::make_unique<Embedder>(*embed_model_, params);
}

ChatMemory::~ChatMemory() = default;

// Unit vectors, so that what is stored compares by its direction alone.
std::vector<float> ChatMemory::embed(const std::string& text) {
  if (!embedder_) return {};
  const std::vector<std::string> texts = {text};
  std::vector<float> v = embedder_->embed(texts).at(0);
  normalize_embedding(v, 2);
  return v;
}

std::vector<MemoryHit> ChatMemory::search(const std::string& text, int k) {
  return store_->search(text, k, embed(text));
}

std::vector<MemoryHit> ChatMemory::recall_into(Chat& chat, const std::string& user_text, size_t n_ctx,
                                               size_t reply_reserve) {
  std::vector<MemoryHit> chosen;
  if (k_ > 0) {
    // This run's own turns are in the conversation already: ask for enough more that
    // leaving them out still leaves k.
    std::vector<MemoryHit> hits = search(user_text, k_ + int(own_turns_.size()));
    // Every match is kept, even one at FTS5's IDF floor (its words are in half the
    // memories or more): in a store of a few memories that is every match, and a new
    // user's first facts must still be recalled. The store leaves words held by more than
    // half of a large store out of the query (MemoryStore::search), so "the" recalls
    // nothing there.
    std::erase_if(hits, [&](const MemoryHit& h) { return own_turns_.count(h.memory.id) > 0; });
    if (hits.size() > size_t(k_)) hits.resize(size_t(k_));
    const auto fits = [&](const std::vector<MemoryHit>& with) {
      chat.set_system(memory_system_prompt(base_system, with));
      return chat.prompt_tokens(user_text).size() + reply_reserve <= n_ctx;
    };
    // Usually all of them fit: one rendering of the conversation. Otherwise one at a
    // time, in rank order, each kept if it still fits (a shorter one further down may).
    if (fits(hits)) {
      chosen = std::move(hits);
    } else {
      for (MemoryHit& h : hits) {
        chosen.push_back(std::move(h));
        if (!fits(chosen)) chosen.pop_back();
      }
    }
  }
  chat.set_system(memory_system_prompt(base_system, chosen));
  return chosen;
}

void ChatMemory::remember_turn(const std::string& user_text) { own_turns_.insert(remember_fact(user_text)); }

int64_t ChatMemory::remember_fact(const std::string& text) { return store_->add(text, conversation_, embed(text)); }

}  // namespace kiln::cli
