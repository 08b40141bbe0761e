#include "server_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <sstream>

#include "test_util.h"

namespace kiln::test {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::string stories_model() { return shared_path("models/stories260K.gguf"); }

ServerProcess::ServerProcess(std::vector<std::string> extra, std::string model) {
  std::vector<std::string> args = {kiln_binary(), "serve", model, "--host", "127.0.0.1", "--port", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDERR_FILENO);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  err_fd_ = fds[0];
  // Drained all along: a full pipe would block the server's access log.
  reader_ = std::thread([this] {
    char buf[4096];
    ssize_t n;
    while ((n = read(err_fd_, buf, sizeof buf)) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      err_.append(buf, size_t(n));
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  const std::regex ready("listening on http://127\\.0\\.0\\.1:([0-9]+)\n");
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    const std::string e = err();
    if (std::regex_search(e, m, ready)) {
      port_ = std::stoi(m[1]);
      return;
    }
    if (waitpid(pid_, &status_, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  ADD_FAILURE() << "kiln serve did not get ready; stderr:\n" << err();
}

int ServerProcess::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (waitpid(pid_, &status_, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "kiln serve did not exit within 20 s of SIGTERM";
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    pid_ = -1;
  }
  if (reader_.joinable()) reader_.join();
  if (err_fd_ >= 0) close(err_fd_), err_fd_ = -1;
  return status_;
}

std::unique_ptr<httplib::Client> ServerProcess::client() const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
  c->set_connection_timeout(5);
  c->set_read_timeout(60);
  c->set_write_timeout(10);
  return c;
}

std::string ServerProcess::err() const {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  bool done = false;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos << ": " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(done) << "event after [DONE]: " << event;
    if (event == "data: [DONE]") done = true;
    else out.push_back(json::parse(event.substr(6)));
    pos = end + 2;
  }
  EXPECT_TRUE(done) << "no data: [DONE]";
  return out;
}

std::vector<json> ndjson_lines(const std::string& body) {
  std::vector<json> out;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    out.push_back(json::parse(line, nullptr, false));
    EXPECT_TRUE(out.back().is_object()) << line;
  }
  EXPECT_FALSE(out.empty());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].value("done", false), i + 1 == out.size()) << out[i];
  return out;
}

double metric_value(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + name.size() + 2));
}

void post_long_stream(httplib::Client& c, const std::function<bool(const char* data, size_t n)>& on_data) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = nlohmann::json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) { return on_data(data, n); };
  (void)c.send(req);
}

}  // namespace kiln::test
