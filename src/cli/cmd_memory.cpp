// kiln memory FILE.db list|search TEXT|add TEXT|forget ID|forget all|export: the chat
// memory store (kiln/memory.h) for scripts. Every answer is JSON on stdout; errors are one
// line on stderr (exit 1, or 2 for a command line that cannot work).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/chat_memory.h"
#include "cli/common.h"
#include "kiln/error.h"
#include "kiln/memory.h"

namespace kiln::cli {
namespace {

struct MemoryOptions {
  std::string file;
  std::string action;
  std::vector<std::string> words;  // the text (joined by spaces) or the id
  int32_t limit = 3;
  std::string conversation;
  std::string lines_from;  // add -f FILE: one memory per line ('-': stdin)
};

nlohmann::json memory_json(const Memory& m) {
  return {{"id", m.id}, {"text", m.text}, {"time", m.time}, {"conversation", m.conversation}};
}

// Stored text is valid UTF-8 (add() checks), but a file edited by other tools may not
// be: replace bad bytes rather than fail the whole listing.
void print_json(const nlohmann::json& j, int indent) {
  write_stdout(j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

int64_t parse_id(const std::string& text) {
  const std::optional<int64_t> id = parse_memory_id(text);
  if (!id) throw UsageError("forget: '" + text + "' is not a memory id (a number from list) or 'all'");
  return *id;
}

// add -f: every non-empty line is one memory in its own transaction, and its id is
// printed (and flushed) only after the commit, so a reader of stdout knows exactly which
// lines are safe if the process dies.
int add_lines(MemoryStore& store, const MemoryOptions& o) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (o.lines_from != "-") {
    file.open(o.lines_from);
    if (!file) throw Error(o.lines_from + ": cannot read");
    in = &file;
  }
  std::string line;
  while (std::getline(*in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    print_json({{"id", store.add(line, o.conversation)}}, -1);
  }
  return 0;
}

int memory(const MemoryOptions& o) {
  const std::string& a = o.action;
  if (a != "list" && a != "search" && a != "add" && a != "forget" && a != "export")
    throw UsageError("memory: unknown action '" + a + "' (list, search, add, forget, export)");
  if ((a == "list" || a == "export") && !o.words.empty())
    throw UsageError("memory " + a + " takes no argument");
  if (a == "search" && o.words.empty()) throw UsageError("memory search needs a TEXT");
  if (a == "forget" && o.words.size() != 1) throw UsageError("memory forget needs one ID, or 'all'");
  if (a == "add" && o.words.empty() == o.lines_from.empty())
    throw UsageError("memory add needs a TEXT or -f FILE (one memory per line, '-': stdin), not both");
  if (a == "forget" && o.words[0] != "all") parse_id(o.words[0]);  // a usage error before the file is opened

  auto store = MemoryStore::open(o.file);
  if (a == "list") {
    nlohmann::json out = nlohmann::json::array();
    for (const Memory& m : store->list()) out.push_back(memory_json(m));
    print_json(out, 2);
  } else if (a == "search") {
    nlohmann::json out = nlohmann::json::array();
    for (const MemoryHit& h : store->search(joined(o.words), o.limit)) {
      nlohmann::json j = memory_json(h.memory);
      j["score"] = h.score;
      if (h.bm25) j["bm25"] = *h.bm25;
      if (h.cosine) j["cosine"] = *h.cosine;
      out.push_back(std::move(j));
    }
    print_json(out, 2);
  } else if (a == "add") {
    if (!o.lines_from.empty()) return add_lines(*store, o);
    print_json({{"id", store->add(joined(o.words), o.conversation)}}, -1);
  } else if (a == "forget") {
    if (o.words[0] == "all") {
      print_json({{"forgotten", store->forget_all()}}, -1);
    } else {
      const int64_t id = parse_id(o.words[0]);
      if (!store->forget(id)) throw Error(o.file + ": no memory with id " + o.words[0]);
      print_json({{"forgotten", 1}}, -1);
    }
  } else {  // export: everything, embeddings included, with the schema it came from
    nlohmann::json memories = nlohmann::json::array();
    for (const Memory& m : store->export_all()) {
      nlohmann::json j = memory_json(m);
      if (!m.embedding.empty()) j["embedding"] = m.embedding;
      memories.push_back(std::move(j));
    }
    print_json({{"format", "kiln-memory"}, {"schema_version", MemoryStore::kSchemaVersion}, {"memories", memories}}, 2);
  }
  return 0;
}

}  // namespace

void register_memory(CLI::App& app, Action& action) {
  auto o = std::make_shared<MemoryOptions>();
  CLI::App* cmd = app.add_subcommand(
      "memory", "A chat memory store (SQLite) for scripts: list, search TEXT, add TEXT, forget ID|all, export (JSON)");
  cmd->add_option("store", o->file, "The memory file (created when missing)")->required();
  cmd->add_option("action", o->action, "list | search TEXT | add TEXT | forget ID|all | export")->required();
  cmd->add_option("args", o->words, "The text (words are joined by spaces) or the id");
  cmd->add_option("-n,--limit", o->limit, "search: how many memories (default 3)")->check(CLI::Range(1, 1000));
  cmd->add_option("--conversation", o->conversation, "add: the conversation id to record");
  cmd->add_option("-f,--file", o->lines_from, "add: one memory per line of FILE ('-': stdin), each id printed once committed");
  cmd->callback([o, &action] { action = [o] { return memory(*o); }; });
}

}  // namespace kiln::cli
