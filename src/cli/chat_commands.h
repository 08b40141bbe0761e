#pragma once
// The slash commands of `kiln chat` (/help, /set, /show, /save...) and the conversation
// files they read and write; kept apart from the read-eval loop in cmd_chat.cpp.
#include <string>

#include "cli/chat_memory.h"
#include "cli/common.h"
#include "kiln/chat.h"

namespace kiln::cli {

// Everything a command may look at or change.
struct ChatState {
  std::string model_path;
  const Model& model;
  Session& session;
  Sampler& sampler;
  Generator& generator;
  Chat& chat;
  GenerationOptions& gen;
  std::string template_origin;
  bool verbose = false;
  ChatTurn last;  // the previous turn, for /stats
  ChatMemory* memory = nullptr;  // --memory; null without
};

enum class CommandResult { handled, quit };

// Runs one input line that starts with '/'. Problems are printed (one line on stderr);
// the conversation is never lost to a mistyped command.
CommandResult run_command(ChatState& state, const std::string& line);

// Prints what ended the reply when it was not the model itself, and with verbose, the
// turn's token counts and speeds.
void report_turn(const ChatState& state, const ChatTurn& turn);

// With verbose, the memories a turn recalled and their scores.
void report_recall(const ChatState& state, const std::vector<MemoryHit>& hits);

// The conversation with its KV cache (and the sampling settings) to/from a session file.
// load_chat prints why a file is refused and returns false; the chat is then unchanged.
// /load restores the saved sampling settings; --session leaves those of the command line.
void save_chat(const ChatState& state, const std::string& path, bool quiet = false);
bool load_chat(ChatState& state, const std::string& path, bool restore_parameters = true);

}  // namespace kiln::cli
