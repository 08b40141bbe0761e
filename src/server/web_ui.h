#pragma once
// The page at GET /: a single-page chat over /v1/chat/completions, embedded in the binary
// (plain HTML and JavaScript, nothing fetched from elsewhere).
namespace kiln::server {
const char* web_ui_html();
}  // namespace kiln::server
