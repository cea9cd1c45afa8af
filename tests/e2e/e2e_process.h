// Fixtures of the end-to-end tests that drive a whole program: the qevict CLI as a process
// (CliTest: the model of $QEVICT_TEST_MODEL, a temporary directory, a run's exit status,
// stdout and stderr) and qevict serve's HTTP library over a real socket (RunningServer: the
// scheduler thread and the server on 127.0.0.1:<any port>, with a client).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/scheduler.h"
#include "kvcache/registry.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace qevict {

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// An empty directory <temp>/<name>-<pid>.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

struct CliRun {
  std::string cmd;  // the shell command, for failure messages
  int rc = -1;      // the exit status (-1: did not exit)
  std::string out, err;
};

// Tests that run the qevict CLI (QEVICT_CLI) on the real model; skipped when
// QEVICT_TEST_MODEL is unset. Files go to a directory of their own, removed afterwards.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* m = std::getenv("QEVICT_TEST_MODEL");
    if (!m || !*m) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
    model_ = m;
    dir_ = fresh_dir(std::string("qevict_") +
                     ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // `qevict ARGS -m MODEL` with `input` on stdin (ARGS are read by the shell).
  CliRun run(const std::string& args, const std::string& input = "") {
    {
      std::ofstream f(dir_ / "in.txt", std::ios::binary);
      f << input;
    }
    CliRun r;
    r.cmd = std::string(QEVICT_CLI) + " " + args + " -m " + model_ + " <" + path("in.txt") + " >" +
            path("out.txt") + " 2>" + path("err.txt");
    const int st = std::system(r.cmd.c_str());
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(dir_ / "out.txt");
    r.err = slurp(dir_ / "err.txt");
    return r;
  }
  std::string model_;
  std::filesystem::path dir_;
};

// A request's cache: kv_policy (default full), kv_budget (a fraction) and kv_budget_bytes,
// with the policy's defaults.
inline Expected<KvCacheParams> request_kv(const OpenAiRequest& q) {
  KvCacheParams p;
  p.policy = q.kv_policy.value_or("full");
  p.budget_fraction = q.kv_budget.value_or(0.0);
  for (const auto& [k, v] : q.kv_options)
    if (k == "budget_bytes") p.budget_bytes = std::stoll(v);
  if (Status s = apply_policy_defaults(&p, KvParamsGiven{}); !s) return s;
  return p;
}

// The server (model id `model_id`, the scheduler's n_ctx) on 127.0.0.1:<any port> and the
// scheduler thread, for its lifetime; client() talks to it (read timeout 300 s).
class RunningServer {
 public:
  RunningServer(Model& model, ThreadPool& pool, const Tokenizer& tok, const SchedulerOptions& so,
                const std::string& chat_template, const std::string& model_id)
      : sched_(model, pool, so),
        server_({model_id, "", so.n_ctx, 1 << 20}, tok, chat_template, sched_, request_kv, stop_) {
    server_.install(svr_);
    port_ = svr_.bind_to_any_port("127.0.0.1");
    http_ = std::thread([this] { svr_.listen_after_bind(); });
    worker_ = std::thread([this] { sched_.run(stop_); });
    cli_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    cli_->set_read_timeout(300);
  }
  ~RunningServer() {
    svr_.stop();
    http_.join();
    stop_.store(true);
    sched_.wake();
    worker_.join();
  }
  int port() const { return port_; }
  const OpenAiServer& server() const { return server_; }
  httplib::Client& client() { return *cli_; }
  // POST /v1/chat/completions: the response's JSON body; {"status", "body"} for another status
  // than 200, {"sse"} for a stream, {"http_error"} when there was no response.
  nlohmann::json chat(const nlohmann::json& body, const std::string& session = "") {
    httplib::Headers h;
    if (!session.empty()) h.emplace("X-Session-Id", session);
    auto r = cli_->Post("/v1/chat/completions", h, body.dump(), "application/json");
    if (!r) return nlohmann::json{{"http_error", int(r.error())}};
    if (r->status != 200) return nlohmann::json{{"status", r->status}, {"body", r->body}};
    if (body.value("stream", false)) return nlohmann::json{{"sse", r->body}};
    return nlohmann::json::parse(r->body);
  }
  // The value of GET /metrics' qevict_<name> (-1: no such line, or no response).
  double metric(const std::string& name) {
    auto r = cli_->Get("/metrics");
    if (!r) return -1;
    const std::string line = "\nqevict_" + name + " ";
    const size_t at = r->body.find(line);
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + line.size()));
  }
  nlohmann::json slots() {
    auto r = cli_->Get("/slots");
    return r ? nlohmann::json::parse(r->body) : nlohmann::json();
  }
  SchedulerMetrics metrics() const { return sched_.metrics(); }

 private:
  std::atomic<bool> stop_{false};
  Scheduler sched_;
  OpenAiServer server_;
  httplib::Server svr_;
  int port_ = -1;
  std::thread http_, worker_;
  std::unique_ptr<httplib::Client> cli_;
};

}  // namespace qevict
