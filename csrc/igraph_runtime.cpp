#include "igraph_runtime.hpp"

#include <stdexcept>

namespace colgraph {
namespace {

thread_local std::string last_igraph_error;

void record_error(const char* reason, const char* file, int line, igraph_error_t code) {
  last_igraph_error = std::string(igraph_strerror(code)) + ": " + (reason ? reason : "") + " (" +
                      (file ? file : "?") + ":" + std::to_string(line) + ")";
  // igraph expects the handler to release what the failing function registered.
  IGRAPH_FINALLY_FREE();
}

void ignore_warning(const char*, const char*, int) {}

}  // namespace

void install_igraph_handlers() {
  igraph_set_error_handler(record_error);
  igraph_set_warning_handler(ignore_warning);
}

void check_igraph(igraph_error_t code, const char* what) {
  if (code == IGRAPH_SUCCESS) return;
  std::string msg = std::string(what) + " failed in igraph: " + last_igraph_error;
  last_igraph_error.clear();
  throw std::runtime_error(msg);
}

std::string igraph_version_string() {
  const char* text = nullptr;
  int major = 0, minor = 0, patch = 0;
  igraph_version(&text, &major, &minor, &patch);
  return text ? std::string(text) : std::to_string(major) + "." + std::to_string(minor);
}

int igraph_self_test() {
  igraph_t g;
  igraph_vector_int_t edges;
  check_igraph(igraph_vector_int_init(&edges, 4), "igraph_vector_int_init");
  VECTOR(edges)[0] = 0; VECTOR(edges)[1] = 1; VECTOR(edges)[2] = 1; VECTOR(edges)[3] = 2;
  igraph_error_t rc = igraph_create(&g, &edges, 3, IGRAPH_UNDIRECTED);
  igraph_vector_int_destroy(&edges);
  check_igraph(rc, "igraph_create");
  int n_edges = static_cast<int>(igraph_ecount(&g));
  igraph_destroy(&g);
  return n_edges;
}

}  // namespace colgraph
