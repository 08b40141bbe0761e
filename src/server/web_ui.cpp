#include "server/web_ui.h"

namespace kiln::server {

const char* web_ui_html() {
  return R"html(<!doctype html>
<html><head><meta charset="utf-8"><title>kiln</title></head>
<body><p>kiln serve: the API is at /v1/chat/completions.</p></body></html>
)html";
}

}  // namespace kiln::server
