#pragma once
// ollama's API shapes (/api/generate, /api/chat, /api/tags, /api/show, /api/version):
// requests with their `options` object, NDJSON streams by default.
#include "server/openai_api.h"

namespace kiln::server {

// /api/generate: prompt through the chat template as one user message (with `system`),
// or as it is with "raw": true. An empty prompt only loads the model (ollama's answer:
// done at once), reported by an empty request.prompt.
ParsedRequest parse_ollama_generate(const json& body, const Tokenizer& tokenizer, const ChatFormatter& chat,
                                    const Defaults& defaults);
// /api/chat: messages as in OpenAI's chat (same checks).
ParsedRequest parse_ollama_chat(const json& body, const Tokenizer& tokenizer, const ChatFormatter& chat,
                                const Defaults& defaults);

// ollama's timestamps: RFC 3339 in UTC with nanoseconds ("2024-05-01T12:00:00.123456789Z").
std::string rfc3339_now();

}  // namespace kiln::server
