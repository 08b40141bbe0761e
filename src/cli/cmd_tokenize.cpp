// kiln tokenize MODEL TEXT: works on any GGUF with a vocabulary, weights or not, or on a
// tokenizer file alone (kiln tokenize --tokenizer tokenizer.json TEXT).
#include <cstdio>

#include "cli/common.h"
#include "kiln/error.h"
#include "kiln/gguf.h"

namespace kiln::cli {
namespace {

struct TokenizeOptions {
  LogOptions log;
  std::string model;
  std::string text;
  std::string file;
  std::string tokenizer_file;
  bool ids_only = false;
  bool no_bos = false;
  bool special = false;
};

std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '\n') out += "\\n";
    else if (ch == '\t') out += "\\t";
    else if (ch == '\'') out += "\\'";
    else if (ch < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", ch); out += b; }
    else out += (char)ch;
  }
  return out;
}

int tokenize(TokenizeOptions& o) {
  setup_logging(o.log);
  // With --tokenizer the model is optional: a lone argument is the text.
  if (!o.tokenizer_file.empty() && o.text.empty() && o.file.empty()) std::swap(o.model, o.text);
  if (o.model.empty() && o.tokenizer_file.empty()) throw UsageError("give a model (or --tokenizer FILE)");
  if (!o.file.empty() && !o.text.empty()) throw UsageError("give the text either as an argument or with -f, not both");
  std::string text = o.file.empty() ? o.text : read_text_file(o.file);
  if (text == "-") text = read_text_file("-");
  std::unique_ptr<Tokenizer> tok;
  if (!o.tokenizer_file.empty()) {
    tok = Tokenizer::from_file(o.tokenizer_file);
  } else {
    auto file = gguf::File::open(resolve_model_path(o.model));
    tok = Tokenizer::from_gguf(*file);
  }
  const auto ids = tok->encode(text, !o.no_bos && tok->vocab().add_bos, o.special);
  if (o.ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
    std::printf("%s]\n", line.c_str());
    return 0;
  }
  for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, escape(tok->token_to_piece(id, true)).c_str());
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, Action& action) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Show the tokens of a text (works on vocabulary-only GGUFs)");
  cmd->add_option("model", o->model, "Model or vocabulary file (GGUF); optional with --tokenizer");
  cmd->add_option("text", o->text, "Text to tokenize ('-' reads stdin)");
  cmd->add_option("-f,--file", o->file, "Read the text from a file");
  cmd->add_flag("--ids", o->ids_only, "Print only the ids, as one JSON array");
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
  cmd->add_flag("--parse-special,--special", o->special,
                "Parse special-token text like <s> or <|im_start|> into control tokens (otherwise literal text)");
  cmd->add_option("--tokenizer", o->tokenizer_file,
                  "Tokenize with this file instead of a GGUF: tokenizer.json, SentencePiece .model or llama2.c tokenizer.bin");
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return tokenize(*o); }; });
}

}  // namespace kiln::cli
