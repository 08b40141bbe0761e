#include "server/routes.h"

namespace kiln::server {

void register_ollama_routes(httplib::Server& svr, ServerState& state) {}

}  // namespace kiln::server
