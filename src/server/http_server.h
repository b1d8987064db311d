// The OpenAI-compatible HTTP front door (on http_door's event loop): routes, bearer-token auth,
// CORS, request validation, SSE streaming, metrics, request logs and a periodic status line. It
// tokenizes and validates each request, submits it to a serving::GenerationBackend and relays
// the output; it never touches the engine itself.
//
//   HttpServer server(options, {&tokenizer, chat_template, ""}, backend.get());
//   TANDEM_RETURN_IF_ERROR(server.Bind());
//   std::thread t([&] { server.Run(); });
//   ...                          // on SIGTERM:
//   server.BeginDrain();         // new requests get 503, /health says 503
//   backend->Drain(deadline);    // in-flight requests finish
//   server.WaitIdle(deadline);   // their responses are written
//   server.Stop(); t.join();
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
// GET /metrics. With an API key set, /v1/* requires "Authorization: Bearer <key>" (401 else);
// /health and /metrics stay open for probes and scrapers.
//
// Threading: connections live on the door's event loop and cost no thread; a complete request
// runs its handler on one of `http_threads` threads (validating, tokenizing, submitting), then
// its output moves to the client from the event loop as the backend produces it
// (server/response_pump.h). The backend calls the RequestSinks from its own threads and never
// waits on a client. Destroy the server only after the backend has stopped calling sinks
// (Drain, or the backend destroyed).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "server/metrics.h"
#include "serving/backend.h"

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (see HttpServer::port())
  std::string api_key;  // empty: no authentication
  // Browser origins (e.g. "https://chat.example.com") whose pages may call the API: their
  // requests get Access-Control-Allow-Origin, their preflights (OPTIONS, never behind the API
  // key) an answer. "*": any origin (vLLM's and llama-server's default); empty: none.
  std::vector<std::string> allowed_origins = {"*"};
  std::string served_model_name = "model";
  std::vector<std::string> model_aliases;  // further names clients may use for the model
  int max_model_len = 2048;                // tokens, prompt + completion
  double request_timeout_s = 600;          // arrival to finish; then the request fails (timeout)
  size_t max_body_bytes = 8u << 20;        // larger bodies get 413
  size_t max_header_bytes = 16u << 10;     // larger request heads get 431
  size_t max_connections = 0;              // open at once; 0: from the descriptor limit
  int http_threads = 8;                    // handler threads (connections need none)
  double status_interval_s = 10;           // the periodic status line; <= 0: none
  // How the model writes tool calls, for chat templates that render tools themselves; nullopt:
  // read from the template (structured::ToolFormatOfTemplate). Templates that do not render
  // tools get tandem's own offer, in the Hermes format, whatever this says.
  std::optional<engine::SamplingParams::ToolFormat> tool_call_format;
};

struct ModelInfo {
  const model::Tokenizer* tokenizer = nullptr;         // not owned; outlives the server
  const model::ChatTemplate* chat_template = nullptr;  // null: chat requests get 400
  std::string chat_template_error;                     // why there is none
};

// Thread-safety: call Bind() then Run() (which blocks) once each; every other method may be
// called from any thread, also while Run() serves (port() once Bind() has returned).
class HttpServer {
 public:
  // backend: not owned; must outlive the server.
  HttpServer(ServerOptions options, ModelInfo model, serving::GenerationBackend* backend);
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket (Unavailable when the address is taken).
  Status Bind();
  int port() const;                // the bound port
  size_t max_connections() const;  // client connections held open at most
  // Serves until Stop(); returns false if the server could not run. Call after Bind().
  bool Run();
  // New generation requests get 503 and /health reports draining; in-flight ones continue.
  void BeginDrain();
  bool draining() const;
  // Waits until no generation request is being handled (responses written or abandoned).
  // Returns false at the deadline.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline);
  // Stops listening and makes Run() return. Idempotent.
  void Stop();

  const ServerMetrics& metrics() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server
