// igraph C library glue: error handling that never aborts, and a version report.
#pragma once

#include <igraph.h>

#include <string>

namespace colgraph {

// Installs an igraph error handler that records the message and unwinds igraph's FINALLY
// stack instead of aborting the process (igraph's default). Called once at module import.
void install_igraph_handlers();

// Throws std::runtime_error carrying igraph's last message when `code` is not IGRAPH_SUCCESS.
void check_igraph(igraph_error_t code, const char* what);

std::string igraph_version_string();

// Builds and frees a tiny graph through the library: proves at import that the shared
// library linked is usable, not only present.
int igraph_self_test();

}  // namespace colgraph
