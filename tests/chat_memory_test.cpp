// `kiln chat --memory FILE.db` as a user drives it through a pipe: what one chat is told,
// the next one recalls into its system prompt; /remember, /memory, /forget; two chats
// writing one file at once; recall that never overfills the context; and with
// --embed-model, memories that carry their embeddings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }

// A chat on stories260K with a template that renders the system prompt (chatml), greedy.
CommandResult chat(const std::string& db, const std::string& input, const std::string& flags = "") {
  return run_command(shell_quote(kiln_binary()) + " chat " + shell_quote(model()) +
                         " --chat-template chatml -n 4 --temp 0 --memory " + shell_quote(db) + " " + flags,
                     input);
}

nlohmann::json memory_list(const std::string& db) {
  auto r = run_command(shell_quote(kiln_binary()) + " memory " + shell_quote(db) + " list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

}  // namespace

// Told in one process, recalled by the next: the fact is in the system prompt the second
// chat renders (/show system after the turn), and --verbose names it with its score.
TEST(ChatMemory, WhatOneChatIsToldTheNextRecalls) {
  const std::string db = temp_dir() + "/recall.db";
  auto first = chat(db, "My cat is called Biscuit and she likes fish\n/remember I live in Lisbon\n/memory\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("(remembered as #"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find(" I live in Lisbon"), std::string::npos) << "/memory lists it: " << first.err;
  const nlohmann::json stored = memory_list(db);
  ASSERT_EQ(stored.size(), 2u) << stored.dump();
  EXPECT_EQ(stored[0]["text"], "My cat is called Biscuit and she likes fish") << "the user's turn is remembered";
  EXPECT_EQ(stored[0]["conversation"], stored[1]["conversation"]);
  EXPECT_FALSE(stored[0]["conversation"].get<std::string>().empty());

  auto second = chat(db, "What does my cat like to eat\n/show system\n", "--system 'Be brief.' --verbose");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("[memory: recalled #1 "), std::string::npos) << second.err;
  const size_t system_at = second.err.find("Be brief.\n\nWhat you remember about the user");
  ASSERT_NE(system_at, std::string::npos) << "the system prompt keeps the user's and adds the heading: " << second.err;
  EXPECT_NE(second.err.find("- My cat is called Biscuit and she likes fish", system_at), std::string::npos) << second.err;
  EXPECT_EQ(second.err.find("- I live in Lisbon", system_at), std::string::npos)
      << "a memory sharing no word with the message is not recalled: " << second.err;

  // The second chat's own turn is remembered but not recalled into its own later turns
  // (the conversation holds it already).
  auto third = chat(db, "Tell me about my cat\nAnd my cat again\n", "--verbose --memory-k 5");
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_EQ(count_occurrences(third.err, "recalled #4 "), 0u) << third.err;
  EXPECT_EQ(memory_list(db).size(), 5u);
}

TEST(ChatMemory, SearchAndForgetInTheChat) {
  const std::string db = temp_dir() + "/forget.db";
  auto r = chat(db,
                "/remember The blue bicycle is in the garage\n/remember Dinner is at eight\n"
                "/memory search where is the bicycle\n/forget 1\n/memory search bicycle\n/forget 99\n/forget x\n"
                "/memory\n/forget all\n/memory\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("#1 (score "), std::string::npos) << "/memory search shows ids and scores: " << r.err;
  EXPECT_NE(r.err.find("(forgot #1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(nothing recalled)"), std::string::npos) << "a forgotten memory is not found: " << r.err;
  EXPECT_NE(r.err.find("no memory #99"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/forget needs a memory id"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("#2 Dinner is at eight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(forgot 1 memories)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(the memory is empty)"), std::string::npos) << r.err;
  EXPECT_EQ(memory_list(db).size(), 0u);

  auto none = run_command(shell_quote(kiln_binary()) + " chat " + shell_quote(model()) + " -n 2", "/memory\n/remember x\n");
  EXPECT_NE(none.err.find("/memory: no memory (start kiln chat with --memory FILE.db)"), std::string::npos) << none.err;
}

// Recall takes what fits: a memory too long for the context is left out, the turn goes on.
TEST(ChatMemory, RecallNeverOverfillsTheContext) {
  const std::string db = temp_dir() + "/fit.db";
  std::string long_fact = "the garden";
  for (int i = 0; i < 60; ++i) long_fact += " garden flowers";
  // Three unrelated memories too: a word most memories hold ranks nothing (BM25).
  auto r = chat(db,
                "/remember " + long_fact + "\n/remember The garden gate is red\n/remember Dinner is at eight\n"
                "/remember The car is blue\n/remember Lunch was soup\nTell me about the garden\n/show system\n",
                "-c 256 --verbose");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("- The garden gate is red"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("- the garden garden flowers"), std::string::npos) << "did not fit in 256 tokens: " << r.err;
  EXPECT_EQ(r.err.find("kiln: error"), std::string::npos) << r.err;
}

// Two chats writing one file at once, 100 memories each: all 200 are there.
TEST(ChatMemory, TwoChatsWriteOneFileWithoutLoss) {
  const std::string db = temp_dir() + "/two.db";
  ASSERT_EQ(chat(db, "/memory\n").exit_code, 0);  // created once, then both open it
  const auto facts = [](const std::string& who) {
    std::string in;
    for (int i = 0; i < 100; ++i) in += "/remember " + who + " fact number " + std::to_string(i) + "\n";
    return in;
  };
  CommandResult a, b;
  std::thread ta([&] { a = chat(db, facts("alpha")); });
  std::thread tb([&] { b = chat(db, facts("beta")); });
  ta.join();
  tb.join();
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(count_occurrences(a.err, "(remembered as #"), 100u) << a.err;
  EXPECT_EQ(count_occurrences(b.err, "(remembered as #"), 100u) << b.err;
  const nlohmann::json all = memory_list(db);
  ASSERT_EQ(all.size(), 200u);
  size_t alpha = 0;
  for (const auto& m : all) alpha += m["text"].get<std::string>().starts_with("alpha ");
  EXPECT_EQ(alpha, 100u);
}

// --embed-model: every memory is stored with its embedding (unit length, the model's
// width), and recall reports the cosine beside BM25.
TEST(ChatMemory, EmbeddingsAreStoredAndFusedIntoRecall) {
  const auto vocab = kiln::gguf::File::open(shared_path("vocab/ggml-vocab-bert-bge.gguf"));
  const std::vector<uint8_t> bytes = kiln::gen::build_model(kiln::gen::peaky_options("bert-tiny", 7), *vocab).to_bytes();
  const std::string embedder = temp_dir() + "/bert-tiny.gguf";
  write_file(embedder, std::string(bytes.begin(), bytes.end()));
  const std::string db = temp_dir() + "/embedded.db";
  auto r = chat(db, "/remember The blue bicycle is in the garage\n/remember Dinner is at eight\nWhere is my bicycle\n",
                "--verbose --embed-model " + shell_quote(embedder));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[memory: recalled #1 (score "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", cosine "), std::string::npos) << "recall fuses the cosine: " << r.err;

  auto e = run_command(shell_quote(kiln_binary()) + " memory " + shell_quote(db) + " export");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const nlohmann::json all = nlohmann::json::parse(e.out).at("memories");
  ASSERT_EQ(all.size(), 3u) << e.out;
  for (const auto& m : all) {
    ASSERT_TRUE(m.contains("embedding")) << m.dump();
    double norm = 0;
    for (const auto& x : m["embedding"]) norm += x.get<double>() * x.get<double>();
    EXPECT_NEAR(norm, 1.0, 1e-5) << m["text"];
    EXPECT_GT(m["embedding"].size(), 8u);
  }
}

TEST(ChatMemory, BadFlagsAndForeignFilesAreOneLineErrors) {
  const std::string dir = temp_dir();
  auto k = chat(dir + "/k.db", "", "--memory-k -1");
  EXPECT_EQ(k.exit_code, 2) << k.err;
  EXPECT_NE(k.err.find("--memory-k must be >= 0"), std::string::npos) << k.err;

  auto emb = run_command(shell_quote(kiln_binary()) + " chat " + shell_quote(model()) + " --embed-model x.gguf", "");
  EXPECT_NE(emb.err.find("--embed-model needs --memory FILE.db"), std::string::npos) << emb.err;

  const std::string foreign = dir + "/notes.txt";
  write_file(foreign, "not a database at all, just the user's notes\n");
  auto f = chat(foreign, "Hello\n");
  EXPECT_EQ(f.exit_code, 1) << f.err;
  EXPECT_NE(f.err.find(foreign + ": not a kiln memory store"), std::string::npos) << f.err;
  EXPECT_EQ(read_file(foreign), "not a database at all, just the user's notes\n");
}
