// `kiln chat` as a user drives it: in a pseudo-terminal (typed lines, slash commands, Ctrl-C
// in the middle of an answer, Ctrl-D), through a pipe, and across runs with --session.
// `kiln run --chat` renders the same template as `kiln template`.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "pty_util.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }
std::string kiln_cmd() { return shell_quote(kiln_binary()); }

CommandResult kiln_run(const std::string& args, const std::string& input = "") {
  return run_command(kiln_cmd() + " " + args, input);
}

// One verbose turn report: "[prompt: N tokens evaluated, M reused, ...]".
struct TurnReport {
  int evaluated = 0;
  int reused = 0;
  int reply = 0;
};

std::vector<TurnReport> turn_reports(const std::string& text) {
  static const std::regex re(R"(\[prompt: (\d+) tokens evaluated, (\d+) reused[^|]*\| reply: (\d+) tokens)");
  std::vector<TurnReport> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3])});
  return out;
}

}  // namespace

// The scripted session of the issue: two turns, /set, /save, /clear, /load, Ctrl-C in the
// middle of an answer, and Ctrl-D, all in a terminal.
TEST(ChatPty, ScriptedSession) {
  const std::string dir = temp_dir() + "/pty";
  ASSERT_EQ(run_command("mkdir -p " + shell_quote(dir)).exit_code, 0);
  const std::string saved = dir + "/chat.kiln";
  PtyProcess p({kiln_binary(), "chat", model(), "-c", "8192", "-n", "24", "--temp", "0", "--ignore-eos", "--verbose"},
               {{"KILN_HISTORY", dir + "/history"}});
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.expect(">>>", 20));

  p.send("Once upon a time\r");
  ASSERT_TRUE(p.expect_regex(R"(\[prompt: 5 tokens evaluated, 0 reused[^\]]*reply: 24 tokens)"));
  ASSERT_TRUE(p.expect(">>>"));

  p.send("/set top_k 1\r");
  ASSERT_TRUE(p.expect("top_k 1"));
  ASSERT_TRUE(p.expect(">>>"));
  p.send("/show parameters\r");
  ASSERT_TRUE(p.expect_regex(R"(top_k 1\s)"));
  ASSERT_TRUE(p.expect(">>>"));

  p.send("The cat sat\r");
  ASSERT_TRUE(p.expect_regex(R"(\[prompt: \d+ tokens evaluated, (\d+) reused)"));
  {
    const auto reports = turn_reports(p.output());
    ASSERT_EQ(reports.size(), 2u) << p.transcript();
    EXPECT_GE(reports[1].reused, 5 + 24 - 1) << "the second turn recomputed the first: " << p.transcript();
    EXPECT_LT(reports[1].evaluated, 10) << p.transcript();
  }
  ASSERT_TRUE(p.expect(">>>"));

  p.send("/save " + saved + "\r");
  ASSERT_TRUE(p.expect("(saved "));
  ASSERT_TRUE(p.expect(">>>"));
  p.send("/clear\r");
  ASSERT_TRUE(p.expect("(new conversation)"));
  ASSERT_TRUE(p.expect(">>>"));
  p.send("/stats\r");
  ASSERT_TRUE(p.expect("context: 0 / 8192"));
  ASSERT_TRUE(p.expect(">>>"));
  p.send("/load " + saved + "\r");
  ASSERT_TRUE(p.expect_regex(R"(\(resumed \d+ tokens, 4 messages from )"));
  ASSERT_TRUE(p.expect(">>>"));

  // A long answer, stopped once it is under way; the program and the conversation stay.
  p.send("/set num_predict 8000\r");
  ASSERT_TRUE(p.expect(">>>"));
  p.send("Then\r");
  ASSERT_TRUE(p.expect_regex(R"(Then\r?\n[^\r\n]{40})", 20)) << "the answer did not start";
  p.send("\x03");
  ASSERT_TRUE(p.expect("(stopped)"));
  ASSERT_TRUE(p.expect(">>>"));
  p.send("/set num_predict 8\r");
  ASSERT_TRUE(p.expect(">>>"));
  p.send("The end\r");
  ASSERT_TRUE(p.expect_regex(R"(\[prompt: \d+ tokens evaluated, \d+ reused)"));
  ASSERT_TRUE(p.expect(">>>"));
  {
    const auto reports = turn_reports(p.output());
    ASSERT_EQ(reports.size(), 4u) << p.transcript();
    // Turn 3 ran on the loaded cache; the stopped reply stayed in the conversation.
    EXPECT_GE(reports[2].reused, reports[1].reused + 24) << p.transcript();
    EXPECT_GT(reports[2].reply, 0);
    EXPECT_LT(reports[2].reply, 8000);
    EXPECT_GE(reports[3].reused, reports[2].reused + reports[2].evaluated + reports[2].reply - 1) << p.transcript();
  }

  EXPECT_NE(p.output().find("\x1b[1;32m>>>"), std::string::npos) << "a terminal gets a coloured prompt";
  p.send("\x04");
  EXPECT_EQ(p.wait(), 0) << p.transcript();
  EXPECT_NE(read_file(dir + "/history").find("The\\040cat\\040sat"), std::string::npos);
}

// The same commands through a pipe: no prompt decoration, every reply on stdout.
TEST(ChatPipe, SaveClearLoadContinuesOnTheCache) {
  const std::string saved = temp_dir() + "/pipe.kiln";
  auto r = kiln_run("chat " + shell_quote(model()) + " -n 12 --temp 0 --verbose",
                    "/set top_k 7\nOnce upon a time\n/save " + saved + "\n/clear\n/set top_k 3\nHello\n/load " + saved +
                        "\n/show parameters\n/help\n/show info\n/show template\n/nonsense\nThe dog\n/bye\nnever read\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(">>>"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\x1b"), std::string::npos) << "escape codes in piped output";
  const auto reports = turn_reports(r.err);
  ASSERT_EQ(reports.size(), 3u) << r.err;
  EXPECT_EQ(reports[1].reused, 0) << "after /clear nothing is reused: " << r.err;
  EXPECT_GE(reports[2].reused, 5 + 12 - 1) << "after /load the saved turn is reused: " << r.err;
  EXPECT_EQ(count_occurrences(r.out, "\n"), 3u) << r.out;
  EXPECT_NE(r.err.find("\ntop_k 7\n"), std::string::npos) << "/load restores the saved settings: " << r.err;
  EXPECT_NE(r.err.find("/load FILE"), std::string::npos) << "/help lists the commands: " << r.err;
  EXPECT_NE(r.err.find("architecture   llama"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("for m in messages"), std::string::npos) << "/show template prints its source: " << r.err;
  EXPECT_NE(r.err.find("unknown command /nonsense"), std::string::npos) << r.err;
}

// kiln chat --session: the second run resumes the first one's cache and answers exactly as
// one run holding both turns does.
TEST(ChatSession, SecondRunResumesAndAnswersAsOneRunWould) {
  const std::string file = temp_dir() + "/resume.kiln";
  const std::string args = "chat " + shell_quote(model()) + " -n 16 --temp 0 --verbose --session " + shell_quote(file);
  auto first = kiln_run(args, "Once upon a time\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("does not exist yet"), std::string::npos) << first.err;

  auto second = kiln_run(args, "The dog ran\n");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("(resumed "), std::string::npos) << second.err;
  const auto reports = turn_reports(second.err);
  ASSERT_EQ(reports.size(), 1u) << second.err;
  EXPECT_GE(reports[0].reused, 5 + 16 - 1) << second.err;

  auto together = kiln_run("chat " + shell_quote(model()) + " -n 16 --temp 0", "Once upon a time\nThe dog ran\n");
  ASSERT_EQ(together.exit_code, 0) << together.err;
  EXPECT_EQ(first.out + second.out, together.out);

  // The file holds both turns now (four messages): a third run resumes them.
  // Sampling settings come from this command line, not from the file (-n 3, not 16).
  auto third = kiln_run("chat " + shell_quote(model()) + " -n 3 --temp 0 --verbose --session " + shell_quote(file),
                        "/stats\nThe end\n");
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_NE(third.err.find(" 4 messages"), std::string::npos) << third.err;
  const auto third_reports = turn_reports(third.err);
  ASSERT_EQ(third_reports.size(), 1u) << third.err;
  EXPECT_EQ(third_reports[0].reply, 3) << third.err;
}

// Refused files: the message names the file and the reason, the chat starts clean and the
// file is not overwritten.
TEST(ChatSession, CorruptedOrForeignFilesAreRefused) {
  const std::string dir = temp_dir() + "/refused";
  ASSERT_EQ(run_command("mkdir -p " + shell_quote(dir)).exit_code, 0);
  const std::string file = dir + "/s.kiln";
  auto made = kiln_run("chat " + shell_quote(model()) + " -n 8 --temp 0 --session " + shell_quote(file),
                       "Once upon a time\n");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  std::string bytes = read_file(file);
  ASSERT_GT(bytes.size(), 200u);

  std::string corrupted = bytes;
  corrupted[corrupted.size() - 7] ^= 0x40;  // in the KV bytes
  write_file(dir + "/corrupted.kiln", corrupted);
  auto r = kiln_run("chat " + shell_quote(model()) + " -n 8 --temp 0 --verbose --session " +
                        shell_quote(dir + "/corrupted.kiln"),
                    "The dog\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("corrupted.kiln: corrupted"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("starting a new conversation"), std::string::npos) << r.err;
  auto reports = turn_reports(r.err);
  ASSERT_EQ(reports.size(), 1u) << r.err;
  EXPECT_EQ(reports[0].reused, 0);
  EXPECT_EQ(read_file(dir + "/corrupted.kiln"), corrupted) << "a refused session file was overwritten";

  // Another model (the same weights quantized): its cache would be wrong here.
  const std::string q8 = dir + "/q8.gguf";
  ASSERT_EQ(kiln_run("quantize " + shell_quote(model()) + " " + shell_quote(q8) + " Q8_0").exit_code, 0);
  r = kiln_run("chat " + shell_quote(q8) + " -n 8 --temp 0 --verbose --session " + shell_quote(file), "The dog\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("s.kiln"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model"), std::string::npos) << r.err;
  reports = turn_reports(r.err);
  ASSERT_EQ(reports.size(), 1u) << r.err;
  EXPECT_EQ(reports[0].reused, 0);
  EXPECT_EQ(read_file(file), bytes);

  // /load of a bad file in the middle of a chat keeps the conversation that is going on.
  r = kiln_run("chat " + shell_quote(model()) + " -n 8 --temp 0 --verbose",
               "Once upon a time\n/load " + dir + "/corrupted.kiln\nThe dog\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("corrupted (checksum mismatch)"), std::string::npos) << r.err;
  reports = turn_reports(r.err);
  ASSERT_EQ(reports.size(), 2u) << r.err;
  EXPECT_GE(reports[1].reused, 5 + 8 - 1) << r.err;
}

// kiln run --chat feeds the model exactly what `kiln template` renders (after BOS).
TEST(RunChat, PromptIsTheRenderedTemplate) {
  const std::string dir = temp_dir() + "/cnv";
  ASSERT_EQ(run_command("mkdir -p " + shell_quote(dir)).exit_code, 0);
  write_file(dir + "/conv.json", R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}])");
  auto rendered = kiln_run("template " + shell_quote(model()) + " --chat-template chatml --messages " +
                           shell_quote(dir + "/conv.json") + " --add-generation-prompt");
  ASSERT_EQ(rendered.exit_code, 0) << rendered.err;
  write_file(dir + "/rendered.txt", rendered.out);
  auto ids = kiln_run("tokenize " + shell_quote(model()) + " -q --ids -f " + shell_quote(dir + "/rendered.txt"));
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const size_t n_tokens = count_occurrences(ids.out, ",") + 1;
  ASSERT_GT(n_tokens, 20u);

  for (const std::string flag : {"--chat", "-cnv"}) {
    auto r = kiln_run("run " + shell_quote(model()) + " " + flag +
                      " --chat-template chatml --system 'Be brief.' 'Hi there' -n 4 --temp 0");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("prompt: " + std::to_string(n_tokens) + " tokens"), std::string::npos)
        << flag << " expected " << n_tokens << " prompt tokens: " << r.err;
  }
  auto plain = kiln_run("run " + shell_quote(model()) + " --system 'Be brief.' 'Hi there' -n 4");
  EXPECT_EQ(plain.exit_code, 2) << "--system without --chat is a usage error";
}

TEST(RunChat, TemplateThatRaisesGivesItsMessage) {
  const std::string file = temp_dir() + "/raises.jinja";
  write_file(file,
             "{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif -%}"
             "{%- for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}");
  auto r = kiln_run("run " + shell_quote(model()) + " -cnv --chat-template-file " + shell_quote(file) +
                    " --system 'Be brief.' Hi -n 4");
  expect_one_line_error(r, 1, "System role not supported");

  auto ok = kiln_run("run " + shell_quote(model()) + " -cnv --chat-template-file " + shell_quote(file) + " Hi -n 4");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  // In the REPL the same template error fails that turn only.
  auto chat = kiln_run("chat " + shell_quote(model()) + " -n 4 --chat-template-file " + shell_quote(file),
                       "/system Be brief.\nHi\n/system off\nHi\n");
  EXPECT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.err.find("System role not supported"), std::string::npos) << chat.err;
  EXPECT_EQ(count_occurrences(chat.out, "\n"), 1u) << chat.out;
}
