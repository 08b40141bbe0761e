// LineEditor (src/cli/line_editor.h) through tests/line_editor_driver: typed into a
// pseudo-terminal (libedit mode) and fed through a pipe (plain mode).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli/line_editor.h"
#include "pty_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

const std::string kLeft = "\x1b[D", kUp = "\x1b[A", kCtrlC = "\x03", kCtrlD = "\x04";
// The prompts as a colour terminal gets them (the reset comes before the last character).
const std::string kPrompt = "\x1b[1;32m>>>\x1b[0m ", kMore = "\x1b[1;32m...\x1b[0m ";

std::string fresh_dir(const std::string& name) {
  const std::string dir = temp_dir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The driver in a terminal: xterm, colour allowed, history in `history` (never the real home).
std::unique_ptr<PtyProcess> start(const std::string& history) {
  return std::make_unique<PtyProcess>(std::vector<std::string>{LINE_EDITOR_DRIVER},
                                      std::map<std::string, std::string>{
                                          {"TERM", "xterm"}, {"KILN_HISTORY", history}, {"NO_COLOR", ""}});
}

// Types a line once the previous prompt is there, and waits for the driver's echo of it.
bool enter(PtyProcess& p, const std::string& typed, const std::string& expected_input) {
  if (!p.expect(kPrompt)) return false;
  p.send(typed + "\r");
  return p.expect("[input:" + expected_input + "]");
}

TEST(LineEditorPty, EditsWithArrowKeysAndRecallsWithUp) {
  auto p = start(fresh_dir("edit") + "/history");
  ASSERT_TRUE(p->expect(kPrompt));
  p->send("abc");
  ASSERT_TRUE(p->expect("abc"));
  p->send(kLeft + "X\r");
  ASSERT_TRUE(p->expect("[input:abXc]"));
  ASSERT_TRUE(enter(*p, "second", "second"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kUp + kUp);  // back past "second" to "abXc"
  ASSERT_TRUE(p->expect("abXc"));
  p->send("\r");
  ASSERT_TRUE(p->expect("[input:abXc]"));
  // UTF-8 is edited by character, not by byte.
  ASSERT_TRUE(enter(*p, "h\xc3\xa9" + kLeft + "X", "hX\xc3\xa9"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kCtrlD);
  ASSERT_TRUE(p->expect("[eof]"));
  EXPECT_EQ(p->wait(), 0);
}

TEST(LineEditorPty, TripleQuotesMakeOneMultiLineInput) {
  auto p = start("");
  ASSERT_TRUE(p->expect(kPrompt));
  p->send("\"\"\"\r");
  ASSERT_TRUE(p->expect(kMore));
  p->send("first line\r");
  ASSERT_TRUE(p->expect(kMore));
  p->send("\r");
  ASSERT_TRUE(p->expect(kMore));
  p->send("last\"\"\"\r");
  ASSERT_TRUE(p->expect("[input:first line\\n\\nlast]"));
  ASSERT_TRUE(enter(*p, "\"\"\"inline\"\"\"", "inline"));
  // Keys typed before the prompt reach a terminal in cooked mode, where Ctrl-D is not a key.
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kCtrlD);
  EXPECT_EQ(p->wait(), 0);
}

TEST(LineEditorPty, CtrlCDiscardsTheLineAndTheBlockButNotTheProgram) {
  auto p = start("");
  ASSERT_TRUE(p->expect(kPrompt));
  p->send("abc" + kLeft + kLeft);
  ASSERT_TRUE(p->expect("abc\b\b"));  // Ctrl-C flushes keys not read yet: wait for the moves
  p->send(kCtrlC);
  ASSERT_TRUE(p->expect("bc^C"));  // the text right of the cursor is redrawn, then ^C
  ASSERT_TRUE(enter(*p, "def", "def"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send("\"\"\"\r");
  ASSERT_TRUE(p->expect(kMore));
  p->send("lost\r");
  ASSERT_TRUE(p->expect(kMore));
  p->send(kCtrlC);
  ASSERT_TRUE(p->expect("^C"));
  ASSERT_TRUE(enter(*p, "kept", "kept"));
  EXPECT_EQ(p->output().find("[input:abc"), std::string::npos) << p->transcript();
  EXPECT_EQ(p->output().find("lost]"), std::string::npos) << p->transcript();
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kCtrlD);
  EXPECT_EQ(p->wait(), 0);
}

TEST(LineEditorPty, CtrlCStopsWorkAndTheNextInputStillWorks) {
  auto p = start("");
  ASSERT_TRUE(enter(*p, "work", "work"));
  ASSERT_TRUE(p->expect("[working]"));
  ASSERT_TRUE(p->expect("..."));
  p->send(kCtrlC);
  ASSERT_TRUE(p->expect("[stopped]"));
  ASSERT_TRUE(enter(*p, "after", "after"));
  // A second time: the handler stays in force after a read().
  ASSERT_TRUE(enter(*p, "work", "work"));
  ASSERT_TRUE(p->expect("..."));
  p->send(kCtrlC);
  ASSERT_TRUE(p->expect("[stopped]"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kCtrlD);
  ASSERT_TRUE(p->expect("[eof]"));
  EXPECT_EQ(p->wait(), 0);
}

TEST(LineEditorPty, HistoryIsSavedAndLoadedByTheNextRun) {
  const std::string history = fresh_dir("history") + "/sub/dir/history";  // directories made on demand
  {
    auto p = start(history);
    ASSERT_TRUE(enter(*p, "first run", "first run"));
    ASSERT_TRUE(p->expect(kPrompt));
    p->send("\"\"\"\r");
    ASSERT_TRUE(p->expect(kMore));
    p->send("two\r");
    ASSERT_TRUE(p->expect(kMore));
    p->send("lines\"\"\"\r");
    ASSERT_TRUE(p->expect("[input:two\\nlines]"));
    ASSERT_TRUE(enter(*p, "last of the first run", "last of the first run"));
    ASSERT_TRUE(p->expect(kPrompt));
    p->send(kCtrlD);
    EXPECT_EQ(p->wait(), 0);
  }
  // libedit's format: a header line, then one entry a line with spaces and newlines as \ooo.
  EXPECT_EQ(read_file(history), "_HiStOrY_V2_\nfirst\\040run\ntwo\\012lines\nlast\\040of\\040the\\040first\\040run\n");
  auto p = start(history);
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kUp);
  ASSERT_TRUE(p->expect("last of the first run"));
  p->send("\r");
  ASSERT_TRUE(p->expect("[input:last of the first run]"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kUp + kUp + "\r");  // the multi-line input comes back whole
  ASSERT_TRUE(p->expect("[input:two\\nlines]"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kCtrlD);
  EXPECT_EQ(p->wait(), 0);
}

TEST(LineEditorPty, UnwritableHistoryWarnsOnceAndGoesOn) {
  const std::string dir = fresh_dir("unwritable");
  write_file(dir + "/file", "");
  auto p = start(dir + "/file/history");  // a directory that cannot be made
  ASSERT_TRUE(enter(*p, "one", "one"));
  ASSERT_TRUE(enter(*p, "two", "two"));
  ASSERT_TRUE(p->expect(kPrompt));
  p->send(kCtrlD);
  EXPECT_EQ(p->wait(), 0);
  const std::string& out = p->output();
  const size_t warning = out.find("cannot write the history file");
  EXPECT_NE(warning, std::string::npos) << p->transcript();
  EXPECT_EQ(warning, out.rfind("cannot write the history file")) << p->transcript();
}

// stdin a terminal, stdout a file: editing still works, drawn on stderr; the file gets only
// what the program printed. NO_COLOR: a plain prompt.
TEST(LineEditorPty, StdoutRedirectedKeepsEscapeCodesOutOfIt) {
  const std::string dir = fresh_dir("redirected");
  auto p = std::make_unique<PtyProcess>(
      std::vector<std::string>{"/bin/sh", "-c",
                               "exec " + shell_quote(LINE_EDITOR_DRIVER) + " >" + shell_quote(dir + "/out")},
      std::map<std::string, std::string>{{"TERM", "xterm"}, {"KILN_HISTORY", ""}, {"NO_COLOR", "1"}});
  ASSERT_TRUE(p->expect(">>> "));
  p->send("helo" + kLeft + "l\r");
  ASSERT_TRUE(p->expect(">>> "));
  EXPECT_EQ(p->output().find("\x1b[1;32m"), std::string::npos) << p->transcript();
  p->send(kCtrlD);
  EXPECT_EQ(p->wait(), 0);
  EXPECT_EQ(read_file(dir + "/out"), "[input:hello]\n[eof]\n");
}

TEST(LineEditorPipe, PlainLinesBlocksAndEof) {
  const std::string dir = fresh_dir("pipe");
  const std::string input =
      "hello\n"
      "\"\"\"\nline one\n\nline three\n\"\"\"\n"
      "\"\"\"inline\nmore\"\"\"\n"
      "\"\"\"single\"\"\"\n"
      "\n"
      "crlf\r\n"
      "last without newline";
  auto r = run_command("KILN_HISTORY=" + shell_quote(dir + "/history") + " " + shell_quote(LINE_EDITOR_DRIVER), input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "[input:hello]\n"
            "[input:line one\\n\\nline three]\n"
            "[input:inline\\nmore]\n"
            "[input:single]\n"
            "[input:]\n"
            "[input:crlf]\n"
            "[input:last without newline]\n"
            "[eof]\n");
  EXPECT_EQ(r.err, "");
  EXPECT_FALSE(std::filesystem::exists(dir + "/history")) << "a pipe has no history";
}

TEST(LineEditorPipe, UnfinishedBlockAtEofIsStillAnInput) {
  auto r = run_command("KILN_HISTORY= " + shell_quote(LINE_EDITOR_DRIVER), "\"\"\"\nabc\ndef\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[input:abc\\ndef]\n[eof]\n");
}

TEST(LineEditor, DefaultHistoryPath) {
  auto with_env = [](const char* kiln, const char* xdg, const char* home) {
    auto set = [](const char* k, const char* v) { v ? setenv(k, v, 1) : unsetenv(k); };
    set("KILN_HISTORY", kiln);
    set("XDG_DATA_HOME", xdg);
    set("HOME", home);
    return cli::default_history_path();
  };
  const char* home = std::getenv("HOME");
  const std::string saved_home = home ? home : "";
  EXPECT_EQ(with_env("/t/h", "/x", "/home/u"), "/t/h");
  EXPECT_EQ(with_env("", "/x", "/home/u"), "");
  EXPECT_EQ(with_env(nullptr, "/x", "/home/u"), "/x/kiln/history");
  EXPECT_EQ(with_env(nullptr, "relative", "/home/u"), "/home/u/.local/share/kiln/history");
  EXPECT_EQ(with_env(nullptr, nullptr, "/home/u"), "/home/u/.local/share/kiln/history");
  EXPECT_EQ(with_env(nullptr, nullptr, nullptr), "");
  setenv("HOME", saved_home.c_str(), 1);
  unsetenv("KILN_HISTORY");
}

}  // namespace
}  // namespace kiln::test
