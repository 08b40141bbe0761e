#include "cli/chat_commands.h"
#include "cli/speculation.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "kiln/error.h"
#include "kiln/session_file.h"
#include "util/json_number.h"
#include "util/ms_since.h"

namespace kiln::cli {
namespace {

using nlohmann::ordered_json;

double per_second(int32_t n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; }

void say(const std::string& text) { std::fprintf(stderr, "%s\n", text.c_str()); }

void print_help() {
  say("commands:\n"
      "  /set temp|top_k|top_p|min_p|repeat_penalty|seed|num_predict VALUE\n"
      "  /set system TEXT|off   the system prompt (same as /system TEXT)\n"
      "  /set verbose|quiet     show or hide per-turn token counts and speeds\n"
      "  /system [TEXT|off]     show, set or remove the system prompt\n"
      "  /show info|template|parameters|system\n"
      "  /stats                 tokens in the context, speed of the last turn\n"
      "  /clear                 start a new conversation (the system prompt stays)\n"
      "  /save FILE             save the conversation and its KV cache\n"
      "  /load FILE             resume a saved conversation\n"
      "  /memory                what the memory holds (--memory FILE.db), with ids\n"
      "  /memory search TEXT    what a message of TEXT would recall, with scores\n"
      "  /remember TEXT         keep TEXT in the memory\n"
      "  /forget ID|all         remove a memory, or all of them\n"
      "  /bye                   leave (or Ctrl-D)\n"
      "Ctrl-C stops an answer (the conversation keeps it). \"\"\" starts and ends a multi-line message.");
}

std::string parameters_text(const ChatState& s) {
  const SamplerParams& p = s.sampler.params();
  std::ostringstream o;
  o << "temp " << p.temperature << "\ntop_k " << p.top_k << "\ntop_p " << p.top_p << "\nmin_p " << p.min_p
    << "\nrepeat_penalty " << p.repeat_penalty << "\nseed " << s.sampler.seed() << "\nnum_predict " << s.gen.n_predict;
  return o.str();
}

template <typename T>
T parse_number(const std::string& name, const std::string& value) {
  std::istringstream in(value);
  T v{};
  in >> v;
  if (in.fail() || !(in >> std::ws).eof()) throw UsageError("/set " + name + ": '" + value + "' is not a number");
  return v;
}

void set_parameter(ChatState& s, const std::string& name, const std::string& value) {
  if (name == "system") {
    if (value.empty()) throw UsageError("/set system needs a text, or 'off' to remove it");
    if (s.memory) s.memory->base_system = value == "off" ? "" : value;
    s.chat.set_system(value == "off" ? "" : value);
    say(value == "off" ? "(system prompt removed)" : "(system prompt set)");
    return;
  }
  if (name == "verbose" || name == "quiet") {
    s.verbose = name == "verbose";
    say(s.verbose ? "(per-turn statistics on)" : "(per-turn statistics off)");
    return;
  }
  if (value.empty()) throw UsageError("/set " + name + " needs a value (see /help)");
  SamplerParams p = s.sampler.params();
  if (name == "temp" || name == "temperature") p.temperature = parse_number<float>(name, value);
  else if (name == "top_k") p.top_k = parse_number<int32_t>(name, value);
  else if (name == "top_p") p.top_p = parse_number<float>(name, value);
  else if (name == "min_p") p.min_p = parse_number<float>(name, value);
  else if (name == "repeat_penalty") p.repeat_penalty = parse_number<float>(name, value);
  else if (name == "seed") p.seed = value == "-1" ? SamplerParams::kRandomSeed : parse_number<uint64_t>(name, value);
  else if (name == "num_predict" || name == "n_predict") {
    const int32_t n = parse_number<int32_t>(name, value);
    if (n < -1) throw UsageError("/set num_predict must be >= -1 (-1: until end of text or full context), got " + value);
    s.gen.n_predict = n;
    say("(num_predict " + value + ")");
    return;
  } else {
    throw UsageError("/set: unknown parameter '" + name + "' (see /help)");
  }
  s.sampler.set_params(p);
  s.generator.resync_sampler();
  say("(" + name + " " + value + ")");
}

void show(const ChatState& s, const std::string& what) {
  if (what == "info") {
    const ModelConfig& c = s.model.config();
    std::ostringstream o;
    o << "model          " << s.model_path << "\narchitecture   " << c.arch << "\nparameters     " << s.model.n_params()
      << "\nweights        " << type_name(c.weight_type) << "\ncontext        " << s.session.n_ctx() << " (trained "
      << c.n_ctx_train << ")\nlayers         " << c.n_layers << ", dim " << c.dim << ", heads " << c.n_heads << " / "
      << c.n_kv_heads << " kv\nchat template  " << s.template_origin;
    say(o.str());
  } else if (what == "template") {
    say(s.chat.chat_template().source());
  } else if (what == "parameters") {
    say(parameters_text(s));
  } else if (what == "system") {
    say(s.chat.system().empty() ? "(no system prompt)" : s.chat.system());
  } else {
    throw UsageError("/show: expected info, template, parameters or system");
  }
}

void print_stats(const ChatState& s) {
  const GenerationStats& st = s.last.stats;
  std::ostringstream o;
  o << "context: " << s.chat.n_tokens() << " / " << s.session.n_ctx() << " tokens (" << s.session.n_past()
    << " cached)";
  if (st.n_prompt + st.n_generated > 0) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "\nlast turn: prompt %d tokens evaluated (%d reused from the cache) at %.1f tok/s, "
                  "reply %d tokens at %.1f tok/s",
                  st.n_prompt, s.last.n_reused, per_second(st.n_prompt, st.prompt_ms), st.n_generated,
                  per_second(st.n_generated, st.generate_ms));
    o << line;
  }
  say(o.str());
}

std::string hit_line(const MemoryHit& h) {
  char score[160];
  std::snprintf(score, sizeof score, "score %.4f", h.score);
  std::string line = "#" + std::to_string(h.memory.id) + " (" + score;
  if (h.bm25) line += ", bm25 " + std::to_string(*h.bm25);
  if (h.cosine) line += ", cosine " + std::to_string(*h.cosine);
  return line + ") " + h.memory.text;
}

// The words after the command: "/set temp 0.5" -> name "temp", rest "0.5".
std::pair<std::string, std::string> split_first(const std::string& text) {
  const size_t start = text.find_first_not_of(" \t");
  if (start == std::string::npos) return {"", ""};
  const size_t end = text.find_first_of(" \t", start);
  if (end == std::string::npos) return {text.substr(start), ""};
  const size_t rest = text.find_first_not_of(" \t", end);
  return {text.substr(start, end - start), rest == std::string::npos ? "" : text.substr(rest)};
}

void memory_command(const ChatState& s, const std::string& command, const std::string& args) {
  if (!s.memory) throw UsageError(command + ": no memory (start kiln chat with --memory FILE.db)");
  ChatMemory& m = *s.memory;
  if (command == "/remember") {
    if (args.empty()) throw UsageError("/remember needs a text");
    say("(remembered as #" + std::to_string(m.remember_fact(args)) + ")");
  } else if (command == "/forget") {
    if (args == "all") {
      say("(forgot " + std::to_string(m.store().forget_all()) + " memories)");
      return;
    }
    const std::optional<int64_t> id = parse_memory_id(args);
    if (!id) throw UsageError("/forget needs a memory id (see /memory) or 'all'");
    if (!m.store().forget(*id)) throw UsageError("/forget: no memory #" + args);
    say("(forgot #" + args + ")");
  } else {
    const auto [sub, text] = split_first(args);
    if (sub.empty()) {
      const std::vector<Memory> all = m.store().list();
      if (all.empty()) say("(the memory is empty)");
      for (const Memory& mem : all) say("#" + std::to_string(mem.id) + " " + mem.text);
    } else if (sub == "search") {
      if (text.empty()) throw UsageError("/memory search needs a text");
      const std::vector<MemoryHit> hits = m.search(text, 10);
      if (hits.empty()) say("(nothing recalled)");
      for (const MemoryHit& h : hits) say(hit_line(h));
    } else {
      throw UsageError("/memory: expected nothing or 'search TEXT'");
    }
  }
}

}  // namespace

CommandResult run_command(ChatState& s, const std::string& line) {
  const auto [command, args] = split_first(line);
  try {
    if (command == "/bye" || command == "/exit" || command == "/quit") return CommandResult::quit;
    if (command == "/help" || command == "/?") {
      print_help();
    } else if (command == "/clear") {
      s.chat.clear();
      s.last = {};
      say("(new conversation)");
    } else if (command == "/system") {
      if (args.empty()) show(s, "system");
      else set_parameter(s, "system", args);
    } else if (command == "/set") {
      const auto [name, value] = split_first(args);
      if (name.empty()) throw UsageError("/set needs a parameter (see /help)");
      set_parameter(s, name, value);
    } else if (command == "/show") {
      show(s, split_first(args).first);
    } else if (command == "/stats") {
      print_stats(s);
    } else if (command == "/save") {
      if (args.empty()) throw UsageError("/save needs a file name");
      save_chat(s, args);
    } else if (command == "/load") {
      if (args.empty()) throw UsageError("/load needs a file name");
      load_chat(s, args);
    } else if (command == "/memory" || command == "/remember" || command == "/forget") {
      memory_command(s, command, args);
    } else {
      throw UsageError("unknown command " + command + " (try /help)");
    }
  } catch (const Error& e) {
    say("kiln: " + std::string(e.what()));
  }
  return CommandResult::handled;
}

void report_recall(const ChatState& s, const std::vector<MemoryHit>& hits) {
  if (!s.verbose) return;
  if (hits.empty()) say("[memory: nothing recalled]");
  for (const MemoryHit& h : hits) say("[memory: recalled " + hit_line(h) + "]");
}

void report_turn(const ChatState& s, const ChatTurn& turn) {
  const GenerationStats& st = turn.stats;
  if (st.stop == StopReason::cancelled) say("(stopped)");
  if (st.n_discarded > 0)
    say("(the context was full: " + std::to_string(st.n_discarded) + " older tokens were dropped to go on)");
  if (st.stop == StopReason::context_full)
    say("(the context of " + std::to_string(s.session.n_ctx()) + " tokens is full: /clear to start over, or raise -c)");
  if (!s.verbose) return;
  char line[256];
  std::snprintf(line, sizeof line,
                "[prompt: %d tokens evaluated, %d reused, %.1f tok/s | reply: %d tokens, %.1f tok/s | context %zu/%d | "
                "seed %llu]",
                st.n_prompt, turn.n_reused, per_second(st.n_prompt, st.prompt_ms), st.n_generated,
                per_second(st.n_generated, st.generate_ms), s.chat.n_tokens(), s.session.n_ctx(),
                (unsigned long long)s.sampler.seed());
  say(line);
  if (st.spec.n_verify > 0) say("[" + speculation_summary(st.spec, st.n_generated, st.generate_ms) + "]");
}

void save_chat(const ChatState& s, const std::string& path, bool quiet) {
  const auto t0 = std::chrono::steady_clock::now();
  const SamplerParams& p = s.sampler.params();
  const ordered_json app = {
      {"kiln_chat", 1},
      {"chat", s.chat.state()},
      {"parameters",
       {{"temperature", p.temperature}, {"top_k", p.top_k}, {"top_p", p.top_p}, {"min_p", p.min_p},
        {"repeat_penalty", p.repeat_penalty}, {"seed", p.seed}, {"num_predict", s.gen.n_predict}}},
  };
  save_session_file(path, s.session, s.generator.history(), app.dump());
  if (!quiet) {
    char line[512];
    std::snprintf(line, sizeof line, "(saved %zu tokens to %s in %.1f ms)", s.generator.history().size(), path.c_str(),
                  ms_since(t0));
    say(line);
  }
}

bool load_chat(ChatState& s, const std::string& path, bool restore_parameters) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedSession loaded;
  try {
    loaded = load_session_file(path, s.session);
  } catch (const Error& e) {
    say("kiln: " + std::string(e.what()));
    return false;
  }
  // The cache now holds the file's conversation; the rest must follow or all is cleared.
  try {
    s.generator.set_history(std::move(loaded.tokens));
    ordered_json app;
    try {
      app = ordered_json::parse(loaded.app_data);
    } catch (const nlohmann::json::exception&) {
      throw Error("not a kiln chat");
    }
    if (!app.is_object() || !app.contains("chat")) throw Error("not a kiln chat");
    s.chat.restore(app["chat"]);
    if (restore_parameters && app.contains("parameters") && app["parameters"].is_object()) {
      const ordered_json& q = app["parameters"];
      SamplerParams p = s.sampler.params();
      // Checked only so that the conversions are safe: a file holds what /set accepted.
      constexpr double kFloatMax = 1e30;
      p.temperature = float(json_real_or(q, "temperature", p.temperature, -kFloatMax, kFloatMax));
      p.top_k = int32_t(json_integer_or(q, "top_k", p.top_k, INT32_MIN, INT32_MAX));
      p.top_p = float(json_real_or(q, "top_p", p.top_p, -kFloatMax, kFloatMax));
      p.min_p = float(json_real_or(q, "min_p", p.min_p, -kFloatMax, kFloatMax));
      p.repeat_penalty = float(json_real_or(q, "repeat_penalty", p.repeat_penalty, -kFloatMax, kFloatMax));
      if (q.contains("seed"))
        p.seed = q["seed"].is_number_unsigned() ? q["seed"].get<uint64_t>() : uint64_t(json_integer(q["seed"], "seed", 0));
      s.sampler.set_params(p);
      s.generator.resync_sampler();
      s.gen.n_predict = int32_t(json_integer_or(q, "num_predict", s.gen.n_predict, INT32_MIN, INT32_MAX));
    }
  } catch (const std::exception& e) {
    s.chat.clear();
    say("kiln: " + path + ": " + e.what() + " (starting a new conversation)");
    return false;
  }
  s.last = {};
  char line[512];
  std::snprintf(line, sizeof line, "(resumed %zu tokens, %zu messages from %s in %.1f ms)", s.chat.n_tokens(),
                s.chat.messages().size(), path.c_str(), ms_since(t0));
  say(line);
  return true;
}

}  // namespace kiln::cli
