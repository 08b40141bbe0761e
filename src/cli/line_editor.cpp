#include "cli/line_editor.h"

#include <fcntl.h>
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <vector>

namespace kiln::cli {
namespace {

std::atomic<bool> g_interrupted{false};
// Self-pipe: the handler may run on any thread (the thread pool's included), so EINTR in the
// reading thread cannot be relied on; a byte in this pipe wakes the poll() in wait_for_input.
int g_wake[2] = {-1, -1};

void on_sigint(int) {
  g_interrupted.store(true);
  if (g_wake[1] >= 0) {
    const int saved = errno;
    ssize_t r = ::write(g_wake[1], "", 1);
    (void)r;
    errno = saved;
  }
}

void drain_wake_pipe() {
  char buf[64];
  while (g_wake[0] >= 0 && ::read(g_wake[0], buf, sizeof buf) > 0) {}
}

// True when `fd` is readable (or at EOF/error: read() will say), false when Ctrl-C came first.
// Checking the flag before each poll leaves no window: a signal after the check wakes poll.
bool wait_for_input(int fd) {
  while (true) {
    if (g_interrupted.load()) return false;
    pollfd p[2] = {{fd, POLLIN, 0}, {g_wake[0], POLLIN, 0}};
    const int r = ::poll(p, g_wake[0] >= 0 ? 2 : 1, -1);
    if (r < 0 && errno != EINTR) return true;
    if (r > 0 && (p[1].revents & POLLIN)) drain_wake_pipe();
    if (r > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) && !g_interrupted.load()) return true;
  }
}

constexpr const char* kQuotes = R"(""")";
constexpr const char* kContinuation = "... ";
// Marks the prompt's colour codes as non-printing for libedit (EL_PROMPT_ESC).
constexpr char kPromptEsc = '\1';

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
  return out;
}

// A UTF-8 LC_CTYPE for libedit's multibyte decoding, used only by the reading thread during
// el_gets (uselocale), so the program's global locale stays as it is. Model text is UTF-8
// whatever the environment says, hence the C.UTF-8 fallback.
locale_t make_utf8_ctype() {
  locale_t base = duplocale(LC_GLOBAL_LOCALE);
  if (!base) return (locale_t)0;
  locale_t env = newlocale(LC_CTYPE_MASK, "", base);
  if (env && std::strcmp(nl_langinfo_l(CODESET, env), "UTF-8") == 0) return env;
  locale_t fallback = env ? env : base;
  locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", fallback);
  return utf8 ? utf8 : fallback;
}

bool want_colour() {
  const char* no_colour = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  return !(no_colour && *no_colour) && !(term && std::strcmp(term, "dumb") == 0);
}

}  // namespace

std::atomic<bool>& interrupt_flag() { return g_interrupted; }

void install_sigint_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) g_wake[0] = g_wake[1] = -1;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, nullptr);
  });
}

std::string default_history_path() {
  if (const char* env = std::getenv("KILN_HISTORY")) return env;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && xdg[0] == '/') return std::string(xdg) + "/kiln/history";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/share/kiln/history";
  return "";
}

struct LineEditor::Impl {
  enum class Status { line, interrupted, eof };

  EditLine* el = nullptr;  // null: plain mode
  History* hist = nullptr;
  FILE* out = nullptr;     // where libedit draws: stdout, or stderr when stdout is redirected
  locale_t ctype = (locale_t)0;
  bool colour = false;
  std::string shown_prompt;
  std::string history_path;
  std::string pending;     // plain mode: bytes read past the current line
  bool input_eof = false;  // plain mode: read() returned 0
  bool ended = false;      // EOF was returned once: every later read() returns nullopt

  ~Impl() {
    if (el) el_end(el);
    if (hist) history_end(hist);
    if (ctype) freelocale(ctype);
  }

  static char* prompt_fn(EditLine* e) {
    Impl* self = nullptr;
    el_get(e, EL_CLIENTDATA, &self);
    return self->shown_prompt.data();
  }

  // Replaces libedit's reader so that Ctrl-C ends el_gets even when the handler ran on another
  // thread or between two reads. Returns 1 (a character), 0 (EOF) or -1 (errno EINTR: Ctrl-C).
  static int getc_fn(EditLine* e, wchar_t* wc) {
    char bytes[MB_LEN_MAX];
    size_t n = 0;
    while (true) {
      if (!wait_for_input(STDIN_FILENO)) {
        errno = EINTR;
        return -1;
      }
      char c;
      const ssize_t r = ::read(STDIN_FILENO, &c, 1);
      if (r == 0) return 0;
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -1;
      }
      bytes[n++] = c;
      mbstate_t state{};
      wchar_t w = 0;
      const size_t k = std::mbrtowc(&w, bytes, n, &state);
      if (k == (size_t)-2 && n < sizeof bytes) continue;  // an incomplete UTF-8 sequence
      if (k == (size_t)-1 || k == (size_t)-2) {            // invalid bytes: dropped
        n = 0;
        continue;
      }
      *wc = w;
      return 1;
    }
  }

  bool start_editing(const std::string& program) {
    out = isatty(STDOUT_FILENO) ? stdout : isatty(STDERR_FILENO) ? stderr : nullptr;
    if (!isatty(STDIN_FILENO) || !out) return false;
    ctype = make_utf8_ctype();
    const locale_t prev = ctype ? uselocale(ctype) : (locale_t)0;
    el = el_init(program.c_str(), stdin, out, stderr);
    if (prev) uselocale(prev);
    if (!el) return false;
    colour = want_colour();
    hist = history_init();
    HistEvent ev;
    history(hist, &ev, H_SETSIZE, 1000);
    history(hist, &ev, H_SETUNIQUE, 1);
    if (!history_path.empty()) history(hist, &ev, H_LOAD, history_path.c_str());  // absent: fine

    el_set(el, EL_CLIENTDATA, this);
    el_set(el, EL_EDITOR, "emacs");
    el_set(el, EL_HIST, history, hist);
    el_set(el, EL_PROMPT_ESC, prompt_fn, kPromptEsc);
    el_set(el, EL_GETCFN, getc_fn);
    // Keys terminals send that the emacs map may lack: Home/End, Delete, Ctrl-Left/Right.
    for (const char* k : {"\033[H", "\033OH", "\033[1~"}) el_set(el, EL_BIND, k, "ed-move-to-beg", nullptr);
    for (const char* k : {"\033[F", "\033OF", "\033[4~"}) el_set(el, EL_BIND, k, "ed-move-to-end", nullptr);
    el_set(el, EL_BIND, "\033[3~", "ed-delete-next-char", nullptr);
    el_set(el, EL_BIND, "\033[1;5D", "ed-prev-word", nullptr);
    el_set(el, EL_BIND, "\033[1;5C", "em-next-word", nullptr);
    // U+00A0..U+00FF (é, ü, ß...) would be looked up in the 8-bit meta-key map and ring the
    // bell: they are characters to insert.
    for (wchar_t c = 0xa0; c <= 0xff; ++c) {
      const wchar_t key[2] = {c, 0};
      el_wset(el, EL_BIND, key, L"ed-insert", nullptr);
    }
    return true;
  }

  Status read_edit(const std::string& prompt, std::string& line) {
    shown_prompt = prompt;
    if (colour && !prompt.empty()) {
      // libedit emits a non-printing sequence together with the character after it, so the
      // colour reset goes before the prompt's last character: at the very end it is dropped.
      const std::string esc(1, kPromptEsc);
      shown_prompt = esc + "\033[1;32m" + esc + prompt.substr(0, prompt.size() - 1) + esc + "\033[0m" + esc +
                     prompt.back();
    }
    // el_gets draws the prompt before it puts the terminal in raw mode, at its first read:
    // keys typed right after the prompt appeared would meet the cooked terminal, which echoes
    // them and swallows Ctrl-D. So leave canonical mode first; libedit then takes this for a
    // non-cooked state and restores its own cooked settings on return, and restoring ours
    // below covers a return before it switched.
    termios cooked{};
    const bool have_tty = tcgetattr(STDIN_FILENO, &cooked) == 0 && (cooked.c_lflag & ICANON);
    if (have_tty) {
      termios t = cooked;
      t.c_lflag &= ~(ICANON | ECHO);
      t.c_cc[VMIN] = 1;
      t.c_cc[VTIME] = 0;
      tcsetattr(STDIN_FILENO, TCSANOW, &t);
    }
    const locale_t prev = ctype ? uselocale(ctype) : (locale_t)0;
    int count = 0;
    const char* s = el_gets(el, &count);
    if (termios now{}; have_tty && tcgetattr(STDIN_FILENO, &now) == 0 && !(now.c_lflag & ICANON))
      tcsetattr(STDIN_FILENO, TCSANOW, &cooked);
    std::string after_cursor;
    const bool interrupted = !s && g_interrupted.load();
    if (interrupted) {
      const LineInfo* li = el_line(el);
      after_cursor.assign(li->cursor, li->lastchar);
    }
    if (prev) uselocale(prev);
    if (s && count > 0) {
      line.assign(s, (size_t)count);
      if (!line.empty() && line.back() == '\n') line.pop_back();
      return Status::line;
    }
    if (interrupted) {
      // Rewriting the text right of the cursor puts the cursor at the end of the line, so
      // "^C" lands after what was typed, as in a shell.
      std::fputs((after_cursor + "^C\n").c_str(), out);
    } else {
      std::fputc('\n', out);  // after libedit's "^D": the next output starts a fresh line
    }
    std::fflush(out);
    return interrupted ? Status::interrupted : Status::eof;
  }

  Status read_plain(std::string& line) {
    while (true) {
      if (const size_t nl = pending.find('\n'); nl != std::string::npos) {
        line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Status::line;
      }
      if (input_eof) {
        if (pending.empty()) return Status::eof;
        line = std::move(pending);  // a last line without a newline
        pending.clear();
        return Status::line;
      }
      if (!wait_for_input(STDIN_FILENO)) {
        pending.clear();  // only ever a partial line here
        return Status::interrupted;
      }
      char buf[4096];
      const ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
      if (r > 0) pending.append(buf, (size_t)r);
      else if (r == 0 || (errno != EINTR && errno != EAGAIN)) input_eof = true;
    }
  }

  // Rewrites the whole file through a temporary one (at most H_SETSIZE entries), so a crash
  // never leaves half a history and concurrent sessions each leave a complete one.
  void save_history() {
    if (history_path.empty()) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path parent = fs::path(history_path).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    const std::string tmp = history_path + ".tmp" + std::to_string(::getpid());
    HistEvent ev;
    errno = 0;
    if (!ec && history(hist, &ev, H_SAVE, tmp.c_str()) >= 0 && std::rename(tmp.c_str(), history_path.c_str()) == 0)
      return;
    const std::string why = ec ? ec.message() : std::strerror(errno ? errno : EIO);
    std::remove(tmp.c_str());
    std::fprintf(stderr, "kiln: warning: cannot write the history file %s: %s (history kept for this session only)\n",
                 history_path.c_str(), why.c_str());
    history_path.clear();  // warn once
  }

  std::string accept(std::string text) {
    if (el && text.find_first_not_of(" \t\n") != std::string::npos) {
      HistEvent ev;
      history(hist, &ev, H_ENTER, text.c_str());
      save_history();
    }
    return text;
  }
};

LineEditor::LineEditor(const std::string& program, const std::string& history_path) : impl_(std::make_unique<Impl>()) {
  install_sigint_handler();
  impl_->history_path = history_path;
  if (!impl_->start_editing(program)) impl_->out = nullptr;
}

LineEditor::~LineEditor() = default;

bool LineEditor::interactive() const { return impl_->el != nullptr; }

std::optional<std::string> LineEditor::read(const std::string& prompt) {
  Impl& m = *impl_;
  if (m.ended) return std::nullopt;
  // A Ctrl-C that stopped the last reply (or came after it) is not one for this prompt.
  g_interrupted.store(false);
  drain_wake_pipe();
  std::vector<std::string> block;
  bool in_block = false;
  while (true) {
    std::string line;
    const Impl::Status st = m.el ? m.read_edit(in_block ? kContinuation : prompt, line) : m.read_plain(line);
    if (st == Impl::Status::interrupted) {
      block.clear();
      in_block = false;
      g_interrupted.store(false);
      continue;
    }
    if (st == Impl::Status::eof) {
      m.ended = true;
      if (!in_block) return std::nullopt;
      return m.accept(join_lines(block));  // nothing typed is lost
    }
    if (!in_block) {
      if (line.rfind(kQuotes, 0) != 0) return m.accept(line);
      line.erase(0, 3);
      if (line.size() >= 3 && ends_with(line, kQuotes)) return m.accept(line.substr(0, line.size() - 3));
      in_block = true;
      if (!line.empty()) block.push_back(line);
      continue;
    }
    if (ends_with(line, kQuotes)) {
      line.resize(line.size() - 3);
      if (!line.empty()) block.push_back(line);
      return m.accept(join_lines(block));
    }
    block.push_back(line);
  }
}

}  // namespace kiln::cli
