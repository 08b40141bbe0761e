#pragma once
// The input side of `kiln chat`: reads what the user types, with line editing and history
// (libedit) when stdin is a terminal, or plain lines when it is a pipe or a file (tests,
// scripts). Multi-line input goes between `"""` lines in both modes.
//
// Ctrl-C: one SIGINT handler for the whole program sets interrupt_flag(). While read() waits
// for input it discards the current line (and any unfinished """ block), prints "^C" and asks
// again; outside read() the flag is what the generation loop polls to stop a reply.
#include <atomic>
#include <memory>
#include <optional>
#include <string>

namespace kiln::cli {

// Set by the SIGINT handler. read() clears it when it starts waiting; the caller clears it
// before work that Ctrl-C should stop, and polls it during that work.
std::atomic<bool>& interrupt_flag();

// Installs the SIGINT handler (idempotent; LineEditor's constructor calls it too). No
// SA_RESTART: other blocking calls see EINTR as well. The handler also wakes read().
void install_sigint_handler();

// Where the history lives: $KILN_HISTORY if set (empty: no history file), else
// $XDG_DATA_HOME/kiln/history, else $HOME/.local/share/kiln/history, else "" (none).
std::string default_history_path();

class LineEditor {
 public:
  // `history_path`: file to load at start and rewrite after each input ("" = no file). Its
  // directory is created on the first save; if it cannot be written, one warning on stderr
  // and the history stays in memory only. Only the terminal mode uses history.
  explicit LineEditor(const std::string& program, const std::string& history_path = "");
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  // One input: a line without its newline, or a """ block's lines joined with '\n' (the
  // quotes removed). Empty lines come back as "". nullopt at end of input (Ctrl-D on an empty
  // line, end of the pipe); an unfinished """ block at end of input is returned first.
  // `prompt` is shown (in colour) only in terminal mode; a block continues with "... ".
  std::optional<std::string> read(const std::string& prompt = ">>> ");

  // True when reading from a terminal with libedit (prompts and editing), false for pipes.
  bool interactive() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cli
