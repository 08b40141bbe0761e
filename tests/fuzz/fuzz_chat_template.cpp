// The chat-template interpreter (src/chat/jinja/): the template text and the message
// contents both come from the input. Input: [flags] template NUL content NUL content...
// Messages take the roles system, user, assistant in turn (flags bit 1: user first).
// Parsing or rendering may fail only with a kiln::Error.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/chat_template.h"
#include "kiln/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t nul = input.find('\0', at);
    parts.push_back(input.substr(at, nul == std::string::npos ? std::string::npos : nul - at));
    if (nul == std::string::npos || parts.size() == 9) break;
    at = nul + 1;
  }
  static const char* const kRoles[] = {"system", "user", "assistant"};
  std::vector<kiln::ChatMessage> messages;
  for (size_t i = 1; i < parts.size(); ++i)
    messages.push_back({kRoles[(i - 1 + (flags & 2 ? 1 : 0)) % 3], parts[i]});
  try {
    const kiln::ChatTemplate tmpl(parts[0]);
    (void)tmpl.render(messages, flags & 1, "<s>", "</s>");
  } catch (const kiln::Error&) {
  }
  return 0;
}
