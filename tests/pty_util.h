#pragma once
// Runs a program in a pseudo-terminal for tests of interactive behaviour: what the user
// types goes in, everything the program draws comes out (one stream, as on a screen).
// Waits are bounded; a timeout is a test failure with the transcript, never a hang.
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace kiln::test {

class PtyProcess {
 public:
  // Starts argv[0] (a path) on a new 80x24 pty as its session leader and foreground process
  // group, so "\x03" typed into it raises SIGINT there. `env` entries are set (an empty value
  // too) on top of this process's environment. started() tells whether it ran.
  explicit PtyProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~PtyProcess();  // kills the child if it still runs
  PtyProcess(const PtyProcess&) = delete;
  PtyProcess& operator=(const PtyProcess&) = delete;

  bool started() const { return pid_ > 0; }
  void send(const std::string& bytes);  // typed input: "\r" is Enter, "\x03" Ctrl-C, "\x04" Ctrl-D

  // Waits until the output after the previous match contains `text` (or matches the ECMAScript
  // `regex`) and moves past it. On timeout or when the program ends first: a gtest failure
  // with the transcript, and false (ASSERT_TRUE it to stop the test there).
  // The default is generous because a loaded 2-core machine (parallel ctest, other builds)
  // has stalled a reply for over 10 s; a missing reply still fails, only later.
  bool expect(const std::string& text, double timeout_s = 30);
  bool expect_regex(const std::string& regex, double timeout_s = 30);
  // The output not yet consumed by expect(), after waiting `settle_s` for more.
  std::string unread(double settle_s = 0.2);

  // Waits for the exit: the exit status, 128+N after signal N, -1 on timeout (then killed).
  int wait(double timeout_s = 30);

  const std::string& output() const { return out_; }
  std::string transcript() const;  // output() with control characters made visible

 private:
  bool read_some(double timeout_s);  // false once the program closed the terminal
  bool wait_for(const std::string& what, double timeout_s, size_t (*find)(const std::string&, size_t, const std::string&, size_t*));

  pid_t pid_ = -1;
  int master_ = -1;
  int status_ = -1;  // set once reaped
  bool closed_ = false;
  std::string out_;
  size_t pos_ = 0;  // out_ before this was matched by an expect
};

}  // namespace kiln::test
