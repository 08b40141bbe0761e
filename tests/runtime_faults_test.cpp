// Faults at run time, each through the real kiln binary in a child process: a huge -n, a
// context larger than memory allows, invalid UTF-8 on stdin, stdout closed early, the
// model file truncated, replaced or rewritten while in use, a full disk while saving a
// session, SIGINT and SIGTERM during load and generation. (A prompt longer than the
// context: E2E.BadInputsGiveOneLineAndExit1 and E2E.ChatSurvivesAFailedTurn.)
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kiln/model.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }
std::string kiln_cmd() { return shell_quote(kiln_binary()); }

// A fresh directory per test: scripts write out/err/code files there.
std::string dir_for(const std::string& name) {
  const std::string d = temp_dir() + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A copy of the model that a test may truncate or replace.
std::string model_copy(const std::string& dir) {
  const std::string path = dir + "/model.gguf";
  std::filesystem::copy_file(model(), path);
  return path;
}

// An endless generation (until killed or failing): the context shifts instead of filling.
std::string endless_args(const std::string& model_path, const std::string& extra = "") {
  return "run " + shell_quote(model_path) + " 'Once upon a time' -n 1000000 --ignore-eos --context-shift -c 64 --temp 0 " + extra;
}
std::string endless(const std::string& model_path) { return kiln_cmd() + " " + endless_args(model_path); }

std::string read_if_any(const std::string& path) { return std::filesystem::exists(path) ? read_file(path) : ""; }

// A kiln process of our own: every signal at its default disposition (a shell would start
// a background job with SIGINT ignored), stdin from a file, stdout and stderr to files.
class Child {
 public:
  Child(const std::string& args, const std::string& dir, const std::string& input = "") : dir_(dir) {
    write_file(dir + "/in", input);
    const std::string cmd = "exec " + kiln_cmd() + " " + args + " <in >out 2>err";
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t all;
    sigfillset(&all);
    posix_spawnattr_setsigdefault(&attr, &all);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    const std::string sh_cmd = "cd " + shell_quote(dir) + " && " + cmd;
    const char* argv[] = {"/bin/sh", "-c", sh_cmd.c_str(), nullptr};
    if (posix_spawn(&pid_, "/bin/sh", nullptr, &attr, const_cast<char**>(argv), environ) != 0) pid_ = -1;
    posix_spawnattr_destroy(&attr);
  }
  ~Child() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  // Waits (at most ~10 s) until stdout has something.
  bool wait_for_output() const {
    for (int i = 0; i < 200; ++i) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(dir_ + "/out", ec);
      if (!ec && size > 0) return true;
      usleep(50000);
    }
    return false;
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  // The exit status as a shell reports it (128 + signal when killed); -1 if it has not
  // ended within `seconds` (it is killed then).
  int wait(int seconds = 30) {
    for (int i = 0; i < seconds * 20; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        done_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      usleep(50000);
    }
    return -1;
  }
  // "" when the process was killed before its shell opened the file.
  std::string out() const { return read_if_any(dir_ + "/out"); }
  std::string err() const { return read_if_any(dir_ + "/err"); }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  bool done_ = false;
};

}  // namespace

TEST(RuntimeFaults, HugePredictCountStopsAtTheContext) {
  const auto r = run_command(kiln_cmd() + " run " + shell_quote(model()) + " 'Once upon a time' -n 2147483647 --ignore-eos -c 64 --temp 0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("is full"), std::string::npos) << r.err;
  EXPECT_FALSE(trim(r.out).empty());
  // Past int32: a usage error, not a wrapped negative count.
  const auto big = run_command(kiln_cmd() + " run " + shell_quote(model()) + " hi -n 99999999999999999999");
  EXPECT_EQ(big.exit_code, 2) << big.err;
  EXPECT_TRUE(big.out.empty());
}

TEST(RuntimeFaults, ContextLargerThanMemoryIsRefusedBeforeAllocating) {
  // One thread: the attention score rows per position depend on the thread count.
  const auto r = run_command(kiln_cmd() + " run " + shell_quote(model()) + " hi -t 1 -c 2000000000");
  expect_one_line_error(r, 1, "a context of 2000000000 tokens needs 1736.0 GiB (KV cache 1192.1 GiB), more than the");
  EXPECT_NE(r.err.find("lower -c"), std::string::npos) << r.err;
  if (kSanitized) GTEST_SKIP() << "sanitizers reserve terabytes of address space: no ulimit -v";
  // Under an address-space limit of 2 GiB: 8M positions of f16 keys and values (640 bytes
  // each in stories260K) need 4.8 GiB. Without the check the allocation itself fails.
  const std::string limited = "ulimit -v 2097152; exec " + kiln_cmd() + " run " + shell_quote(model()) + " 'Once upon a time' --temp 0 -n 8 -t 1 ";
  expect_one_line_error(run_command(limited + "-c 8000000"), 1, "needs 6.9 GiB (KV cache 4.8 GiB), more than the");
  EXPECT_NE(run_command(limited + "-c 8000000").err.find("available (what the address-space limit, ulimit -v, leaves)"),
            std::string::npos);
  const auto fits = run_command(limited + "-c 256");
  EXPECT_EQ(fits.exit_code, 0) << "the limit must leave room for a normal run: " << fits.err;
}

TEST(RuntimeFaults, InvalidUtf8OnStdin) {
  const std::string bad = "Once \xff\xfe upon a time";
  expect_one_line_error(run_command(kiln_cmd() + " run " + shell_quote(model()) + " - -n 4", bad), 1, "UTF-8");
  // In a chat the turn fails alone: one error line, and the next line is answered.
  const auto chat = run_command("env KILN_HISTORY= " + kiln_cmd() + " chat " + shell_quote(model()) + " -n 8 --temp 0 -c 128",
                                bad + "\nOnce upon a time\n");
  EXPECT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.err.find("UTF-8"), std::string::npos) << chat.err;
  EXPECT_EQ(chat.err.find("error"), chat.err.rfind("error")) << chat.err;
  EXPECT_FALSE(trim(chat.out).empty());
}

// `kiln run ... | head -c 10`: generation stops at the first write after the reader left,
// with exit code 0 and nothing on stderr but the load line: also when the parent shell
// ignores SIGPIPE (then only the EPIPE from write says that the reader is gone).
TEST(RuntimeFaults, StdoutClosedEarlyExitsQuietly) {
  const std::string dir = dir_for("stdout-closed");
  for (const std::string trap : {"", "trap '' PIPE; "}) {
    const auto r = run_command(trap + "{ timeout 60 " + endless(model()) + " 2>" + shell_quote(dir + "/err") +
                               "; echo $? >" + shell_quote(dir + "/code") + "; } | head -c 10");
    EXPECT_EQ(r.out.size(), 10u) << r.out;
    EXPECT_EQ(trim(read_file(dir + "/code")), "0") << trap << read_file(dir + "/err");
    const std::string err = read_file(dir + "/err");
    EXPECT_EQ(err.find("error"), std::string::npos) << err;
    EXPECT_EQ(err.find("generation:"), std::string::npos) << "no stats after the reader left: " << err;
  }
}

// Truncated in place while generating (a copy over it): the next read of a vanished page
// of the mapping ends the process with one error line and exit code 1.
TEST(RuntimeFaults, ModelTruncatedWhileGeneratingIsOneErrorLine) {
  for (const std::string flags : {"", "--no-repack"}) {
    const std::string dir = dir_for("truncated" + std::string(flags.empty() ? "" : "-mapped"));
    const std::string m = model_copy(dir);
    Child kiln_run(endless_args(m, flags), dir);
    ASSERT_TRUE(kiln_run.started());
    ASSERT_TRUE(kiln_run.wait_for_output()) << kiln_run.err();
    std::filesystem::resize_file(m, 0);
    EXPECT_EQ(kiln_run.wait(), 1) << flags;
    const std::string err = trim(kiln_run.err());
    EXPECT_NE(err.substr(err.rfind('\n') + 1).find("kiln: error: a mapped file (the model) was truncated"), std::string::npos)
        << err;
  }
}

// Replaced by a rename (how downloads and package managers replace files): the mapping
// keeps the old inode, so the run goes on unchanged.
TEST(RuntimeFaults, ModelReplacedByRenameKeepsServingTheOldFile) {
  const std::string dir = dir_for("renamed");
  const std::string m = model_copy(dir);
  const std::string args = "run " + shell_quote(m) + " 'Once upon a time' -n 400 --ignore-eos -c 512 --temp 0 --quiet";
  const auto reference = run_command(kiln_cmd() + " " + args);
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  write_file(dir + "/other.gguf", "not a model");
  Child kiln_run(args, dir);
  ASSERT_TRUE(kiln_run.wait_for_output()) << kiln_run.err();
  std::filesystem::rename(dir + "/other.gguf", m);
  EXPECT_EQ(kiln_run.wait(), 0) << kiln_run.err();
  EXPECT_EQ(kiln_run.out(), reference.out);
}

// Rewritten while loading: the loader's size/mtime/inode check after reading refuses it.
TEST(RuntimeFaults, ModelChangedDuringLoadIsRefused) {
  const std::string dir = dir_for("changed-during-load");
  const std::string m = model_copy(dir);
  const std::string bytes = read_file(m);
  kiln::LoadParams unchanged;
  unchanged.after_read = [] {};
  EXPECT_NO_THROW(kiln::Model::load(m, unchanged));
  for (const bool grow : {false, true}) {
    kiln::LoadParams p;
    p.after_read = [&] {
      std::ofstream out(m, std::ios::binary | std::ios::in | std::ios::out);  // in place, same inode
      out.seekp(grow ? std::streamoff(bytes.size()) : 0);
      out.write(grow ? "extra" : bytes.data(), grow ? 5 : 16);
    };
    try {
      kiln::Model::load(m, p);
      ADD_FAILURE() << "a file changed during load was accepted (grow " << grow << ")";
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(m + ": changed while loading"), std::string::npos) << e.what();
    }
  }
}

// A full disk (here: RLIMIT_FSIZE, the same failed write) while a chat saves its session:
// one error line, the chat goes on, and the previous session file is left as it was.
TEST(RuntimeFaults, DiskFullWhileSavingASessionKeepsTheOldFile) {
  const std::string dir = dir_for("disk-full");
  const std::string session = dir + "/chat.kses";
  const std::string chat = "env KILN_HISTORY= " + kiln_cmd() + " chat " + shell_quote(model()) + " -n 4 --temp 0 -c 128 --session " +
                           shell_quote(session);
  ASSERT_EQ(run_command(chat, "Once upon a time\n").exit_code, 0);
  const std::string before = read_file(session);
  ASSERT_GT(before.size(), 1024u);
  // ulimit -f counts blocks of 512 or 1024 bytes depending on the shell: either is far
  // smaller than the session. Outputs go through a pipe, which the limit does not cover.
  const auto r = run_command("( (ulimit -f 1; trap '' XFSZ; exec " + chat + "); echo $? >" + shell_quote(dir + "/code") +
                                 " ) 2>&1 | cat",
                             "The dog\n");
  EXPECT_EQ(trim(read_file(dir + "/code")), "0") << r.out;
  EXPECT_NE(r.out.find("kiln: error: " + session + ": cannot write " + session + ".tmp: File too large"), std::string::npos)
      << r.out;
  EXPECT_TRUE(read_file(session) == before) << "the old session file changed";
  EXPECT_FALSE(std::filesystem::exists(session + ".tmp"));
  // And it still resumes.
  const auto resumed = run_command(chat + " --verbose", "The dog\n");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.err.find("error"), std::string::npos) << resumed.err;
}

// SIGINT and SIGTERM end a run promptly, by the signal (exit status 128 + signal), right
// after start (in load) and during generation, with no error output.
TEST(RuntimeFaults, SignalsDuringLoadAndGeneration) {
  for (const int sig : {SIGINT, SIGTERM}) {
    for (const bool at_start : {true, false}) {
      const std::string dir = dir_for("signal-" + std::to_string(sig) + (at_start ? "-start" : "-generation"));
      Child kiln_run(endless_args(model()), dir);
      ASSERT_TRUE(kiln_run.started());
      if (!at_start) ASSERT_TRUE(kiln_run.wait_for_output()) << kiln_run.err();
      kiln_run.signal(sig);
      EXPECT_EQ(kiln_run.wait(), 128 + sig) << sig << (at_start ? " at start: " : " in generation: ") << kiln_run.err();
      EXPECT_EQ(kiln_run.err().find("error"), std::string::npos) << kiln_run.err();
      EXPECT_EQ(kiln_run.err().find("Sanitizer"), std::string::npos) << kiln_run.err();
    }
  }
}

// SIGTERM in the middle of a chat answer: the session file saved by the previous turn is
// left whole (saves write a temporary file and rename it).
TEST(RuntimeFaults, SigtermDuringAChatKeepsTheSessionFile) {
  const std::string dir = dir_for("sigterm-chat");
  const std::string session = dir + "/chat.kses";
  const std::string chat = "chat " + shell_quote(model()) + " --temp 0 -c 4096 --session " + shell_quote(session);
  ASSERT_EQ(run_command("env KILN_HISTORY= " + kiln_cmd() + " " + chat + " -n 4", "Once upon a time\n").exit_code, 0);
  const std::string before = read_file(session);
  setenv("KILN_HISTORY", "", 1);
  Child kiln_chat(chat + " -n 1000000 --ignore-eos", dir, "The dog\n");
  ASSERT_TRUE(kiln_chat.wait_for_output()) << kiln_chat.err();
  kiln_chat.signal(SIGTERM);
  EXPECT_EQ(kiln_chat.wait(), 128 + SIGTERM) << kiln_chat.err();
  EXPECT_TRUE(read_file(session) == before);
  const auto resumed = run_command("env KILN_HISTORY= " + kiln_cmd() + " " + chat + " -n 4", "The dog\n");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.err.find("error"), std::string::npos) << resumed.err;
}
