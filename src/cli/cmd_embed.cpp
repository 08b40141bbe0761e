// kiln embed MODEL TEXT...: text embeddings as llama.cpp's llama-embedding prints them,
// with its flag names (--pooling, --embd-normalize, --embd-output-format,
// --embd-separator) and output formats: json (OpenAI's list shape, laid out as
// llama-embedding prints it), json+ (and the texts' cosine similarities), array ([[...],[...]]) and raw
// (one vector per line). Each TEXT argument and
// each line of -f FILE is one text (split at --embd-separator, "\n" by default, as
// llama-embedding splits its prompt); all of them run batched (kiln/embedding.h).
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/common.h"
#include "kiln/embedding.h"
#include "kiln/error.h"

namespace kiln::cli {
namespace {

struct EmbedOptions {
  LogOptions log;
  std::string model;
  std::vector<std::string> texts;
  std::string prompt;  // -p: llama-embedding's way of giving the texts
  std::string file;
  std::string pooling;  // empty: the model's
  int embd_normalize = 2;
  std::string format = "json";
  std::string separator = "\n";
  int32_t n_ctx = 0;
  int32_t n_threads = 0;
  RepackFlags repack;
};

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = s.find(sep, start)) != std::string::npos; start = end + sep.size())
    out.push_back(s.substr(start, end - start));
  out.push_back(s.substr(start));
  return out;
}

// One value as llama-embedding prints it: %1.0f for the int16 scaling, else %1.7f.
void append_value(std::string& out, float v, int normalize) {
  char buf[64];
  std::snprintf(buf, sizeof buf, normalize == 0 ? "%1.0f" : "%1.7f", v);
  out += buf;
}

std::string format_output(const std::vector<std::vector<float>>& vectors, const std::string& format, int normalize) {
  std::string out;
  if (format == "raw") {  // one vector per line, values separated by spaces
    for (const auto& v : vectors) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ' ';
        append_value(out, v[i], normalize);
      }
      out += '\n';
    }
    return out;
  }
  const bool json = format != "array";  // json, or json+ (with the cosine similarities)
  out += json ? "{\n  \"object\": \"list\",\n  \"data\": [\n" : "[";
  for (size_t j = 0; j < vectors.size(); ++j) {
    if (j) out += json ? ",\n" : ",";
    if (json) out += "    {\n      \"object\": \"embedding\",\n      \"index\": " + std::to_string(j) + ",\n      \"embedding\": ";
    out += '[';
    for (size_t i = 0; i < vectors[j].size(); ++i) {
      if (i) out += ',';
      append_value(out, vectors[j][i], normalize);
    }
    out += json ? "]\n    }" : "]";
  }
  out += json ? "\n  ]" : "]\n";
  if (format == "json+" && vectors.size() > 1) {  // llama-embedding's matrix, %6.2f
    out += ",\n  \"cosineSimilarity\": [\n";
    for (size_t i = 0; i < vectors.size(); ++i) {
      out += i ? ",\n    [" : "    [";
      for (size_t j = 0; j < vectors.size(); ++j) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%6.2f", j ? ", " : "", cosine_similarity(vectors[i], vectors[j]));
        out += buf;
      }
      out += " ]";
    }
    out += "\n  ]";
  }
  if (json) out += "\n}\n";
  return out;
}

int embed(const EmbedOptions& o) {
  setup_logging(o.log);
  if (o.model.empty()) throw UsageError("give a model: kiln embed MODEL TEXT...");
  if (!o.pooling.empty() && !pooling_from_name(o.pooling))
    throw UsageError("--pooling must be none, mean, cls or last, not '" + o.pooling + "'");
  if (o.embd_normalize < -1)
    throw UsageError("--embd-normalize must be -1 (none), 0 (int16), 1 (taxicab), 2 (euclidean) or a p > 2, not " +
                     std::to_string(o.embd_normalize));
  if (o.format != "json" && o.format != "json+" && o.format != "array" && o.format != "raw")
    throw UsageError("--embd-output-format must be json, json+, array or raw, not '" + o.format + "'");
  if (o.separator.empty()) throw UsageError("--embd-separator must not be empty");
  std::vector<std::string> texts;
  for (const std::string& t : o.texts)
    for (std::string& part : split(t, o.separator)) texts.push_back(std::move(part));
  if (!o.prompt.empty())
    for (std::string& part : split(o.prompt, o.separator)) texts.push_back(std::move(part));
  if (!o.file.empty()) {
    std::string content = read_text_file(o.file);
    if (!content.empty() && content.back() == '\n') content.pop_back();  // a file's last line ends with one
    for (std::string& part : split(content, o.separator)) texts.push_back(std::move(part));
  }
  if (texts.empty()) throw UsageError("give the texts to embed as arguments, with -p TEXT or with -f FILE");

  const std::unique_ptr<Model> model = load_model(resolve_model_path(o.model), o.repack);
  EmbedParams params;
  if (!o.pooling.empty()) params.pooling = pooling_from_name(o.pooling);
  params.n_ctx = o.n_ctx;
  params.n_threads = o.n_threads;
  Embedder embedder(*model, params);
  spdlog::info("kiln: {} text(s), pooling {}, {} dimensions", texts.size(), pooling_name(embedder.pooling()),
               embedder.dim());
  std::vector<std::vector<float>> vectors = embedder.embed(texts);
  for (auto& v : vectors) normalize_embedding(v, o.embd_normalize);
  write_stdout(format_output(vectors, o.format, o.embd_normalize));
  return 0;
}

}  // namespace

void register_embed(CLI::App& app, Action& action) {
  auto o = std::make_shared<EmbedOptions>();
  CLI::App* cmd = app.add_subcommand("embed", "Text embeddings (as llama-embedding): one vector per text");
  cmd->add_option("model", o->model, "Model file (GGUF)");
  cmd->add_option("text", o->texts, "Texts to embed, one vector each (split at --embd-separator)");
  cmd->add_option("-m,--model", o->model, "Model file (GGUF)");
  cmd->add_option("-p,--prompt", o->prompt, "Texts to embed, separated by --embd-separator (llama-embedding's -p)");
  cmd->add_option("-f,--file", o->file, "Texts to embed, one a line ('-' reads stdin)");
  // Values are checked in embed(), so that a bad one is one usage error line.
  cmd->add_option("--pooling", o->pooling, "none|mean|cls|last (default: the model's pooling_type)");
  cmd->add_option("--embd-normalize", o->embd_normalize,
                  "Normalisation: -1 none, 0 max absolute to int16, 1 taxicab, 2 euclidean (default), >2 p-norm");
  cmd->add_option("--embd-output-format", o->format,
                  "json (default; OpenAI style), json+ (and the cosine similarity matrix), array ([[...],...]) or raw "
                  "(a line each)");
  cmd->add_option("--embd-separator", o->separator, "Separator of the texts in an argument, -p or -f (default: newline)");
  cmd->add_option("-c,--ctx-size", o->n_ctx, "Context: the most tokens of one text (0: the model's, at most 4096)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-t,--threads", o->n_threads, "Threads (0: physical cores)")->check(thread_count_check());
  add_repack_flags(*cmd, o->repack);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return embed(*o); }; });
}

}  // namespace kiln::cli
