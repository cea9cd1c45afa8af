// qevict serve: an OpenAI-compatible HTTP server (issue 12) over the continuous-batching
// scheduler (engine/scheduler.h). The API itself (routes, streaming, stop strings, errors,
// metrics) is the library src/server/server.h; this file holds the flags, loads the model,
// runs the scheduler thread, binds the socket and handles signals. Every cache draws from one
// pool of --kv-pool-bytes; a request's kv_<key> fields (kv_policy, kv_budget, kv_q, ...) override
// the --kv-* flags. Conversation reuse (docs/server.md) is on unless --no-cache-prompt;
// --session-dir and --max-sessions say where idle conversations go.
#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "engine/scheduler.h"
#include "server/server.h"

namespace qevict::cli {

namespace {

struct ServeArgs {
  ModelOptions model;
  KvOptions kv;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int64_t n_ctx = 8192;
  std::string pool = "512M";
  int parallel = 8;
  int max_queue = 64;
  int prefill_chunk = 256;
  int64_t max_body = 1 << 20;
  int http_threads = 96;
  bool no_cache_prompt = false;
  std::string session_dir;
  int max_sessions = 16;
};

std::atomic<bool> g_stop{false};
httplib::Server* g_server = nullptr;

void on_signal(int) {
  g_stop.store(true);
  if (g_server) g_server->stop();
}

// "512M", "2G", "1048576" → bytes; 0 on a malformed value.
size_t parse_bytes(const std::string& s) {
  if (s.empty()) return 0;
  size_t mult = 1, n = s.size();
  switch (s.back()) {
    case 'K':
    case 'k':
      mult = size_t(1) << 10;
      --n;
      break;
    case 'M':
    case 'm':
      mult = size_t(1) << 20;
      --n;
      break;
    case 'G':
    case 'g':
      mult = size_t(1) << 30;
      --n;
      break;
    default:
      break;
  }
  size_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    if (s[i] < '0' || s[i] > '9') return 0;
    v = v * 10 + size_t(s[i] - '0');
  }
  return v * mult;
}

// A request's cache: the server's --kv-* flags, then the request's kv_<key> fields, in order.
Expected<KvCacheParams> request_kv_params(const KvOptions& flags, const Loaded& l,
                                          const OpenAiRequest& q) {
  KvOptions kv = flags;
  if (q.kv_policy) kv.list.emplace_back("policy", *q.kv_policy);
  if (q.kv_budget) {
    kv.list.emplace_back("budget", fmt::format("{}", *q.kv_budget));
    kv.list.emplace_back("budget_bytes", "0");
  }
  for (const auto& kvo : q.kv_options) kv.list.push_back(kvo);
  auto kvp = kv_params(kv);
  if (!kvp) return kvp;
  if (!attach_known_calibration(l, &*kvp))
    return Status::error(
        "kv_policy kvquant needs its calibration, which runs the model: start the server with "
        "--kv-policy kvquant (and the same --kv-bits / --kv-q)");
  return kvp;
}

int run_serve(const ServeArgs& a) {
  SchedulerOptions so;
  so.n_ctx = a.n_ctx;
  so.kv_pool_bytes = parse_bytes(a.pool);
  so.max_queue = a.max_queue;
  so.max_batch = a.parallel;
  so.prefill_chunk = a.prefill_chunk;
  so.cache_prompt = !a.no_cache_prompt;
  so.session_dir = a.session_dir;
  so.max_sessions = a.max_sessions;
  if (!a.session_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.session_dir, ec);
    if (!std::filesystem::is_directory(a.session_dir, ec))
      return fail(fmt::format("--session-dir: cannot make the directory '{}'", a.session_dir));
    if (a.no_cache_prompt)
      return fail("--session-dir needs conversation reuse (no --no-cache-prompt)");
  }
  if (so.kv_pool_bytes == 0)
    return fail(
        fmt::format("--kv-pool-bytes: '{}' is not a size (e.g. 1073741824, 512M, 2G)", a.pool));
  if (Status st = so.validate(); !st.is_ok()) return fail(st.message());
  if (a.port < 0 || a.port > 65535) return fail("--port must be in [0, 65535]");
  auto kvp = kv_params(a.kv);
  if (!kvp) return fail(kvp.error());
  auto path = resolve_model_path(a.model.model_path);
  if (!path) return fail(path.error());
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  std::string model_id = *path;
  if (const size_t slash = model_id.find_last_of('/'); slash != std::string::npos)
    model_id = model_id.substr(slash + 1);
  // kvquant's calibration runs the model: at startup, before the scheduler does.
  if (Status st = prepare_kv_params(*loaded, &*kvp, a.model.threads); !st.is_ok())
    return fail(st.message());
  ThreadPool pool(resolve_threads(a.model.threads));
  Scheduler sched(*loaded->model, pool, so);
  OpenAiServerOptions opts;
  opts.model_id = model_id;
  opts.api_key = a.api_key;
  opts.n_ctx = a.n_ctx;
  opts.max_body_bytes = a.max_body;
  const Loaded& l = *loaded;
  OpenAiServer server(
      opts, *l.tokenizer, l.model->gguf().get_string_or("tokenizer.chat_template", ""), sched,
      [&a, &l](const OpenAiRequest& q) { return request_kv_params(a.kv, l, q); }, g_stop);
  if (const std::string w = server.chat_template().startup_warning(model_id); !w.empty())
    std::fprintf(stderr, "%s\n", w.c_str());
  httplib::Server svr;
  const int http_threads = a.http_threads;
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(size_t(http_threads)); };
  server.install(svr);
  g_server = &svr;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  int port = a.port;
  if (port == 0) {
    port = svr.bind_to_any_port(a.host);
    if (port < 0) return fail(fmt::format("cannot bind {}", a.host));
  } else if (!svr.bind_to_port(a.host, port)) {
    return fail(fmt::format("cannot bind {}:{} (in use, or not allowed)", a.host, port));
  }
  std::thread worker([&] { sched.run(g_stop); });
  std::fprintf(stderr, "qevict serve: %s on http://%s:%d (KV pool %zu bytes, policy %s)\n",
               model_id.c_str(), a.host.c_str(), port, so.kv_pool_bytes, kvp->policy.c_str());
  std::fflush(stderr);
  svr.listen_after_bind();
  g_stop.store(true);
  sched.wake();
  worker.join();
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  add_model_options(app, a->model);
  add_kv_options(app, a->kv);
  app.add_option("--host", a->host, "address to bind (default: loopback only)")
      ->capture_default_str();
  app.add_option("--port", a->port, "port (0: any free port, printed on stderr)")
      ->capture_default_str();
  app.add_option("--api-key", a->api_key, "require Authorization: Bearer KEY");
  app.add_option("-c,--ctx-size", a->n_ctx, "tokens per sequence (prompt + max_tokens)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-pool-bytes", a->pool,
                 "bytes all KV caches may hold together (e.g. 536870912, 512M, 2G)")
      ->capture_default_str();
  app.add_option("--parallel", a->parallel, "sequences decoding at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-queue", a->max_queue, "requests waiting for room; more get 429")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefill-chunk", a->prefill_chunk, "prompt tokens per scheduler step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-body-bytes", a->max_body, "largest request body")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-threads", a->http_threads, "connections served at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-cache-prompt", a->no_cache_prompt,
               "prefill every request's whole prompt into a new cache; by default a finished "
               "request's cache and tokens stay as a conversation, and a request whose prompt "
               "starts with one resumes it, prefilling only its new tokens (llama-server's "
               "--cache-prompt)");
  app.add_option("--session-dir", a->session_dir,
                 "directory for conversations: idle ones evicted from the KV pool are written "
                 "here (else dropped) and read back when resumed; a conversation named by "
                 "X-Session-Id or `user` is also written here after each turn, so that another "
                 "server sharing the directory can resume it");
  app.add_option("--max-sessions", a->max_sessions,
                 "idle conversations kept in memory; beyond, the least recently used go to "
                 "--session-dir (or are dropped)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return [a] { return run_serve(*a); };
}

}  // namespace qevict::cli
