#pragma once
// kiln serve as a child process for the server tests: the real binary on stories260K on a
// port it picks (--port 0); stopped by the destructor (SIGTERM, then SIGKILL after a
// timeout) even when an assertion fails. And parsers of the stream formats it sends.
#include <httplib.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace kiln::test {

std::string stories_model();

class ServerProcess {
 public:
  // kiln serve MODEL --port 0 EXTRA...; MODEL defaults to stories260K.
  explicit ServerProcess(std::vector<std::string> extra = {}, std::string model = stories_model());
  ~ServerProcess() { stop(); }
  // SIGTERM, then up to 20 s for the exit; SIGKILL after that. The exit status as waitpid gives it.
  int stop();
  std::unique_ptr<httplib::Client> client() const;
  int port() const { return port_; }
  std::string err() const;  // everything on its stderr so far

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  int port_ = 0;
  int err_fd_ = -1;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string err_;
};

// A streamed /v1/completions of 2000 tokens past the end of text ("ignore_eos"): long
// enough to be running while a test does something else. Each piece of the body goes to
// on_data; returning false hangs up.
void post_long_stream(httplib::Client& c, const std::function<bool(const char* data, size_t n)>& on_data);

// The JSON objects of an SSE body; checks the framing (every event `data: ...\n\n`, the
// last one `data: [DONE]`) with EXPECTs.
std::vector<nlohmann::json> sse_events(const std::string& body);
// The objects of an NDJSON body; every line one object, the last (only) one with done = true.
std::vector<nlohmann::json> ndjson_lines(const std::string& body);
// A sample's value in Prometheus text, -1 if absent.
double metric_value(const std::string& metrics, const std::string& name);

}  // namespace kiln::test
