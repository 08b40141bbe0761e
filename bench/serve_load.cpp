// Load generator for an OpenAI-compatible server (kiln serve, llama-server): N clients,
// each sending M streamed /v1/completions requests one after another; prints aggregate
// generated tokens per second, time to first token and request latency (p50/p99).
//
//   serve_load --url http://127.0.0.1:8080 --clients 8 --requests 4 --max-tokens 64
//
// Every request asks for exactly --max-tokens tokens ("ignore_eos": true, which both
// servers honour) at temperature 0 unless --temp is given; prompts differ per request
// (client and request number appended to --prompt) so that no answer is a replay, while
// the shared beginning lets a prefix cache work as it would for a common system prompt.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int clients = 8, requests = 4, max_tokens = 64;
  double temperature = 0;
  std::string prompt = "Once upon a time, in a small village by the sea, there lived";
  std::string model = "default";
};

struct Sample {
  double ttft_ms = 0, latency_ms = 0;
  int tokens = 0;
  bool ok = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "serve_load: %s\nusage: serve_load [--url http://HOST:PORT] [--clients N] [--requests M] "
               "[--max-tokens T] [--temp X] [--prompt TEXT]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--url") {
      const std::string rest = v.rfind("http://", 0) == 0 ? v.substr(7) : v;
      const size_t colon = rest.rfind(':');
      if (colon == std::string::npos) usage("--url needs a port");
      o.host = rest.substr(0, colon);
      o.port = std::atoi(rest.c_str() + colon + 1);
    } else if (a == "--clients") {
      o.clients = std::atoi(v.c_str());
    } else if (a == "--requests") {
      o.requests = std::atoi(v.c_str());
    } else if (a == "--max-tokens") {
      o.max_tokens = std::atoi(v.c_str());
    } else if (a == "--temp") {
      o.temperature = std::atof(v.c_str());
    } else if (a == "--prompt") {
      o.prompt = v;
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (o.clients < 1 || o.requests < 1 || o.max_tokens < 1 || o.port <= 0) usage("counts and the port must be positive");
  return o;
}

// One streamed request: the first chunk with text marks the first token; the count is
// the chunks that carried text (one token each on both servers) unless usage says more.
Sample one_request(const Options& o, int client, int n) {
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(600, 0);
  nlohmann::json body = {{"model", o.model},
                         {"prompt", o.prompt + " (" + std::to_string(client) + "." + std::to_string(n) + ")"},
                         {"max_tokens", o.max_tokens},
                         {"temperature", o.temperature},
                         {"ignore_eos", true},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  Sample s;
  std::string buffer;
  int chunks = 0, usage_tokens = -1;
  const auto t0 = Clock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, end + 2)) {
      const std::string event = buffer.substr(0, end);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const auto j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) usage_tokens = j["usage"].value("completion_tokens", -1);
      if (j.contains("choices") && !j["choices"].empty() && !j["choices"][0].value("text", "").empty()) {
        if (chunks++ == 0) s.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      }
    }
    return true;
  };
  const httplib::Result res = cli.send(req);
  s.latency_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.ok = res && res->status == 200;
  s.tokens = usage_tokens >= 0 ? usage_tokens : chunks;
  return s;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<Sample> samples;
  std::mutex mu;
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < o.clients; ++c)
    clients.emplace_back([&, c] {
      for (int n = 0; n < o.requests; ++n) {
        const Sample s = one_request(o, c, n);
        std::lock_guard lock(mu);
        samples.push_back(s);
      }
    });
  for (std::thread& t : clients) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();

  std::vector<double> ttft, latency;
  long tokens = 0;
  int failed = 0;
  for (const Sample& s : samples) {
    if (!s.ok) {
      ++failed;
      continue;
    }
    tokens += s.tokens;
    ttft.push_back(s.ttft_ms);
    latency.push_back(s.latency_ms);
  }
  std::printf("clients %d, requests %zu (%d failed), tokens %ld in %.2f s: %.2f tok/s; "
              "ttft p50 %.1f ms p99 %.1f ms; latency p50 %.1f ms p99 %.1f ms\n",
              o.clients, samples.size(), failed, tokens, wall, double(tokens) / wall, percentile(ttft, 0.5),
              percentile(ttft, 0.99), percentile(latency, 0.5), percentile(latency, 0.99));
  return failed == 0 ? 0 : 1;
}
