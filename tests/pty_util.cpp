#include "pty_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>
#include <thread>

extern char** environ;

namespace kiln::test {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t find_text(const std::string& out, size_t from, const std::string& text, size_t* end) {
  const size_t at = out.find(text, from);
  if (at != std::string::npos) *end = at + text.size();
  return at;
}

size_t find_regex(const std::string& out, size_t from, const std::string& re, size_t* end) {
  std::smatch m;
  const std::string tail = out.substr(from);
  if (!std::regex_search(tail, m, std::regex(re))) return std::string::npos;
  *end = from + (size_t)(m.position(0) + m.length(0));
  return from + (size_t)m.position(0);
}

}  // namespace

PtyProcess::PtyProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  // Everything exec needs is built before fork: the child only calls exec and _exit.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (!env.count(kv.substr(0, kv.find('=')))) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  winsize ws{};
  ws.ws_row = 24;
  ws.ws_col = 80;
  pid_ = forkpty(&master_, nullptr, nullptr, &ws);
  if (pid_ == 0) {
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  if (pid_ < 0) ADD_FAILURE() << "forkpty failed: " << std::strerror(errno);
  else fcntl(master_, F_SETFD, FD_CLOEXEC);  // later children must not keep this terminal open
}

PtyProcess::~PtyProcess() {
  if (pid_ > 0 && status_ < 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (master_ >= 0) close(master_);
}

void PtyProcess::send(const std::string& bytes) {
  size_t done = 0;
  while (master_ >= 0 && done < bytes.size()) {
    const ssize_t n = ::write(master_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ADD_FAILURE() << "cannot write to the pty: " << std::strerror(errno);
      return;
    }
    done += (size_t)n;
  }
}

bool PtyProcess::read_some(double timeout_s) {
  if (master_ < 0) closed_ = true;  // never started: nothing will come
  if (closed_) return false;
  pollfd p{master_, POLLIN, 0};
  const int r = ::poll(&p, 1, (int)(timeout_s * 1000));
  if (r <= 0) return true;
  char buf[4096];
  const ssize_t n = ::read(master_, buf, sizeof buf);
  if (n > 0) {
    out_.append(buf, (size_t)n);
    return true;
  }
  if (n < 0 && errno == EINTR) return true;
  closed_ = true;  // EIO: every copy of the terminal's slave side is closed
  return false;
}

bool PtyProcess::wait_for(const std::string& what, double timeout_s,
                          size_t (*find)(const std::string&, size_t, const std::string&, size_t*)) {
  const double deadline = now_s() + timeout_s;
  while (true) {
    size_t end = 0;
    if (find(out_, pos_, what, &end) != std::string::npos) {
      pos_ = end;
      return true;
    }
    const double left = deadline - now_s();
    if (closed_ || left <= 0) {
      ADD_FAILURE() << (closed_ ? "the program ended" : "timed out") << " waiting for \"" << what
                    << "\"; output so far (| marks the last match):\n"
                    << transcript();
      return false;
    }
    read_some(std::min(left, 0.1));
  }
}

bool PtyProcess::expect(const std::string& text, double timeout_s) { return wait_for(text, timeout_s, find_text); }
bool PtyProcess::expect_regex(const std::string& regex, double timeout_s) {
  return wait_for(regex, timeout_s, find_regex);
}

std::string PtyProcess::unread(double settle_s) {
  const double deadline = now_s() + settle_s;
  while (now_s() < deadline && read_some(deadline - now_s())) {}
  return out_.substr(pos_);
}

int PtyProcess::wait(double timeout_s) {
  if (pid_ <= 0) return -1;
  const double deadline = now_s() + timeout_s;
  while (status_ < 0) {
    int st = 0;
    const pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (now_s() > deadline) {
      ADD_FAILURE() << "the program did not exit within " << timeout_s << " s; output:\n" << transcript();
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      status_ = 128 + SIGKILL;
      return -1;
    }
    // Keep reading: a program blocked writing to a full terminal would never exit.
    if (!read_some(0.02)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // What it wrote just before exiting.
  for (int i = 0; i < 100 && !closed_; ++i) {
    pollfd p{master_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) break;
    read_some(0);
  }
  return status_;
}

std::string PtyProcess::transcript() const {
  std::string t;
  for (size_t i = 0; i <= out_.size(); ++i) {
    if (i == pos_) t += "|";
    if (i == out_.size()) break;
    const unsigned char c = (unsigned char)out_[i];
    if (c == '\n') t += "\\n\n";
    else if (c == 0x1b) t += "\\e";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      t += buf;
    } else t += (char)c;
  }
  return t;
}

}  // namespace kiln::test
