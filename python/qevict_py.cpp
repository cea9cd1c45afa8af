// Python bindings (issue 12 item 5): qevict.Model(path).generate(prompt, kv_policy=...,
// kv_budget=...), teacher-forced logits, and the cache's tier map and stats as NumPy arrays,
// for researchers working in notebooks next to kvpress. A thin layer over the engine: the
// same loader, tokenizer, chat template, registry defaults and generate() as the CLI, so a
// greedy call reproduces `qevict generate` token for token.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/generator.h"
#include "kernel_switches.h"
#include "kernels/matmul.h"
#include "kvcache/factory.h"
#include "kvcache/options.h"
#include "kvcache/registry.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace py = pybind11;

namespace qevict {
namespace {

[[noreturn]] void raise(const std::string& msg) { throw py::value_error(msg); }

// The keyword arguments through the shared KV option parser (kvcache/options.h), as the CLI's
// flags and the server's request fields.
KvCacheParams make_params(const std::string& policy, py::object budget, const std::string& route,
                          const std::string& score) {
  KvOptionList opts{{"policy", policy}};
  if (!budget.is_none()) opts.emplace_back("budget", py::str(budget).cast<std::string>());
  if (!route.empty()) opts.emplace_back("prefill_route", route);
  if (!score.empty()) opts.emplace_back("score", score);
  auto p = make_kv_params(opts);
  if (!p) raise(p.error());
  return *p;
}

// The cache's report as Python: stats dict, and the tier map [units, positions] (uint8:
// 0 local/sink, 1 full, 2 quantized, 3 evicted — Tier's values).
py::dict report_dict(const SequenceKvCache& c) {
  KvReport r;
  c.report(&r, ReportDetail::kTiers);
  const KvLayerReport t = r.total();
  py::dict d;
  d["policy"] = r.policy;
  d["describe"] = r.describe;
  d["bytes_held"] = r.bytes_held;
  d["peak_bytes_held"] = r.peak_bytes_held;
  d["budget_bytes_per_layer"] = r.budget.total;
  d["routing_events"] = r.routing_events;
  d["bytes_full"] = t.bytes_full;
  d["bytes_quant"] = t.bytes_quant;
  d["bytes_sink"] = t.bytes_sink;
  d["evictions"] = t.evictions;
  d["promotions"] = t.promotions;
  d["demotions"] = t.demotions;
  d["per_head"] = r.per_head;
  size_t units = r.position_tiers.size(), n = units ? r.position_tiers[0].size() : 0;
  py::array_t<uint8_t> tiers({units, n});
  auto m = tiers.mutable_unchecked<2>();
  for (size_t u = 0; u < units; ++u)
    for (size_t i = 0; i < n; ++i)
      m(u, i) = i < r.position_tiers[u].size() ? uint8_t(r.position_tiers[u][i]) : uint8_t(3);
  d["tier_map"] = tiers;
  return d;
}

class PyModel {
 public:
  PyModel(const std::string& path, int threads) : pool_(threads > 0 ? threads : 1) {
    auto m = Model::load(path);
    if (!m) raise(m.error());
    model_ = std::move(*m);
    auto t = Tokenizer::from_gguf(model_->gguf());
    if (!t) raise(t.error());
    tok_ = std::make_unique<Tokenizer>(std::move(*t));
  }

  std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) {
    return tok_->encode(text, add_special, parse_special);
  }
  std::string detokenize(const std::vector<int32_t>& ids) { return tok_->decode(ids); }

  // The prompt as the CLI builds it: raw text, or a user message in the chat template.
  std::vector<int32_t> prompt_tokens(const std::string& prompt, bool chat) {
    if (!chat) return tok_->encode(prompt, true, false);
    std::vector<ChatMessage> msgs{{"user", prompt}};
    const std::string tmpl = model_->gguf().get_string_or("tokenizer.chat_template", "");
    std::string text;
    if (tmpl.empty()) {
      text = render_chatml(msgs, true);
    } else {
      auto ct = ChatTemplate::parse(tmpl);
      if (!ct) raise(ct.error());
      auto r = ct->render(msgs, true, tok_->token_to_piece(tok_->bos(), true),
                          tok_->token_to_piece(tok_->eos(), true));
      if (!r) raise(r.error());
      text = *r;
    }
    return tok_->encode(text, true, true);
  }

  py::dict generate(const std::string& prompt, int max_tokens, const std::string& kv_policy,
                    py::object kv_budget, const std::string& prefill_route,
                    const std::string& kv_score, float temperature, int64_t seed, bool chat,
                    bool ignore_eos, int prefill_chunk) {
    const KvCacheParams p = make_params(kv_policy, kv_budget, prefill_route, kv_score);
    GenerationRequest req;
    req.prompt = prompt_tokens(prompt, chat);
    if (req.prompt.empty()) raise("the prompt has no tokens");
    if (max_tokens < 0) raise("max_tokens must be >= 0");
    auto c = make_kv_cache(model_->kv_shape(), int64_t(req.prompt.size()) + max_tokens, p);
    if (!c) raise(c.error());
    req.cache = c->get();
    req.n_predict = max_tokens;
    req.sampling.temperature = temperature;
    req.sampling.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
    if (!ignore_eos)
      for (int32_t id = 0; id < tok_->n_vocab(); ++id)
        if (tok_->is_eog(id)) req.stop_tokens.push_back(id);
    std::vector<GenerationRequest> reqs{std::move(req)};
    GenerateOptions go;
    go.prefill_chunk = prefill_chunk;
    GenerationStats st;
    {
      py::gil_scoped_release release;
      const Status s = qevict::generate(*model_, pool_, reqs, go, nullptr, &st);
      if (!s.is_ok()) {
        py::gil_scoped_acquire acquire;
        raise(s.message());
      }
    }
    std::vector<int32_t> out = reqs[0].output;
    if (reqs[0].hit_stop && !out.empty()) out.pop_back();  // the stop token is not text
    py::dict d;
    d["text"] = tok_->decode(out);
    d["tokens"] = reqs[0].output;
    d["prompt_tokens"] = reqs[0].prompt.size();
    d["hit_stop"] = reqs[0].hit_stop;
    d["prompt_seconds"] = st.prompt_seconds;
    d["decode_seconds"] = st.decode_seconds;
    d["cache"] = report_dict(**c);
    return d;
  }

  // Teacher-forced logits f32 [n_tokens, n_vocab] of `tokens` through a cache of the given
  // policy (prefilled in chunks, routing as the cache does), and its final report.
  py::tuple logits(const std::vector<int32_t>& tokens, const std::string& kv_policy,
                   py::object kv_budget, const std::string& prefill_route, int chunk) {
    if (tokens.empty()) raise("no tokens");
    if (chunk < 1) raise("chunk must be >= 1");
    const KvCacheParams p = make_params(kv_policy, kv_budget, prefill_route, "");
    auto c = make_kv_cache(model_->kv_shape(), int64_t(tokens.size()), p);
    if (!c) raise(c.error());
    const int64_t n = int64_t(tokens.size()), V = model_->config().n_vocab;
    py::array_t<float> out({n, V});
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release release;
      for (int64_t off = 0; off < n; off += chunk) {
        const int64_t k = std::min<int64_t>(chunk, n - off);
        std::vector<BatchSegment> segs{{c->get(), tokens.data() + off, k, true, dst + off * V}};
        const Status s = model_->forward(segs, pool_);
        if (!s.is_ok()) {
          py::gil_scoped_acquire acquire;
          raise(s.message());
        }
      }
    }
    return py::make_tuple(out, report_dict(**c));
  }

  py::dict info() const {
    py::dict d;
    const KvShape s = model_->kv_shape();
    d["n_layers"] = s.n_layers;
    d["n_q_heads"] = s.n_q_heads;
    d["n_kv_heads"] = s.n_kv_heads;
    d["head_dim"] = s.head_dim;
    d["n_vocab"] = model_->config().n_vocab;
    return d;
  }

 private:
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace
}  // namespace qevict

PYBIND11_MODULE(_qevict, m) {
  using qevict::PyModel;
  m.doc() = "qevict: long-context LLM decoding with a recoverable tiered KV cache";
  // QEVICT_AMX, QEVICT_Q8, QEVICT_PV_INT8 = 0 turn those kernels off, as for the CLI: read once,
  // here (the library reads no environment).
  qevict::cli::apply_env_kernel_switches();
  m.def("policies", [] {
    std::vector<std::string> names;
    for (const auto& r : qevict::policy_registry()) names.push_back(r.name);
    return names;
  });
  // Process-wide, as in the CLI's --matmul: "q8" (8-bit activations in decode-sized
  // matmuls, llama.cpp's precision; the default where the CPU has AVX-512 VNNI) or "f32"
  // (exact products).
  m.def(
      "set_matmul",
      [](const std::string& mode) {
        if (mode != "q8" && mode != "f32")
          qevict::raise("matmul must be 'q8' or 'f32', got '" + mode + "'");
        qevict::matmul_set_q8(mode == "q8");
      },
      py::arg("mode"));
  m.def("matmul", [] { return std::string(qevict::matmul_q8_enabled() ? "q8" : "f32"); });
  py::class_<PyModel>(m, "Model")
      .def(py::init<const std::string&, int>(), py::arg("path"), py::arg("threads") = 2)
      .def("info", &PyModel::info)
      .def("tokenize", &PyModel::tokenize, py::arg("text"), py::arg("add_special") = true,
           py::arg("parse_special") = false)
      .def("detokenize", &PyModel::detokenize, py::arg("tokens"))
      .def("generate", &PyModel::generate, py::arg("prompt"), py::arg("max_tokens") = 64,
           py::arg("kv_policy") = "full", py::arg("kv_budget") = py::none(),
           py::arg("prefill_route") = "", py::arg("kv_score") = "", py::arg("temperature") = 0.0f,
           py::arg("seed") = 0, py::arg("chat") = false, py::arg("ignore_eos") = false,
           py::arg("prefill_chunk") = 512)
      .def("logits", &PyModel::logits, py::arg("tokens"), py::arg("kv_policy") = "full",
           py::arg("kv_budget") = py::none(), py::arg("prefill_route") = "",
           py::arg("chunk") = 512);
}
