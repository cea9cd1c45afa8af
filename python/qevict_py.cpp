// Python bindings (issue 12 item 5): qevict.Model(path).generate(prompt, kv_policy=...,
// kv_budget=...), teacher-forced logits, and the cache's tier map and stats as NumPy arrays,
// for researchers working in notebooks next to kvpress. A thin layer over the engine: the
// same loader, tokenizer, chat template, registry defaults and generate() as the CLI, so a
// greedy call reproduces `qevict generate` token for token. Sessions (issue 50):
// model.session(kv_policy=..., ...) holds a conversation's compressed cache turn after turn
// (engine/session.h), saved to and loaded from a session file.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/generator.h"
#include "engine/session.h"
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

// Every KV option as a keyword argument kv_<key> (kv_policy, kv_budget, kv_q, kv_window,
// kv_prefill_route, ...; prefill_route and prefill_window also without the prefix, as
// generate() takes them) through the shared KV option parser (kvcache/options.h), as the CLI's
// flags and the server's request fields: what every binding that makes a cache reads. None
// leaves an option at its default; True/False are 1/0.
KvCacheParams kv_params(const py::dict& kw) {
  KvOptionList opts;
  for (auto item : kw) {
    const std::string name = py::str(item.first);
    const py::handle v = item.second;
    if (v.is_none()) continue;
    const std::string key = name.rfind("kv_", 0) == 0 ? name.substr(3) : name;
    if (!find_kv_option(key) ||
        (key == name && key != "prefill_route" && key != "prefill_window")) {
      std::string keys;
      for (const KvOptionInfo& o : kv_options()) keys += (keys.empty() ? "kv_" : ", kv_") + o.key;
      raise("unknown keyword argument '" + name + "' (KV options: " + keys + ")");
    }
    const std::string val = py::isinstance<py::bool_>(v) ? (v.cast<bool>() ? "1" : "0")
                                                         : py::str(v).cast<std::string>();
    opts.emplace_back(key, val);
  }
  auto p = make_kv_params(opts);
  if (!p) raise(p.error());
  return *p;
}

// Model.generate's and Model.logits' KV arguments (an empty string: not given), the same way;
// the budget as its str() (True is 'True', an error, as it always was here).
KvCacheParams kv_params(const std::string& policy, const py::object& budget,
                        const std::string& route, const std::string& score) {
  auto or_none = [](const std::string& v) {
    return v.empty() ? py::object(py::none()) : py::str(v);
  };
  py::dict kw;
  kw["kv_policy"] = policy;
  kw["kv_budget"] = budget.is_none() ? budget : py::str(budget);
  kw["kv_prefill_route"] = or_none(route);
  kw["kv_score"] = or_none(score);
  return kv_params(kw);
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
  // Where the prompt's end looked (tiered caches with a prompt-end window; --kv-adapt's
  // statistic and choice): [layer] dicts, the mean KL, and "coverage" / "configured" / "".
  py::list focus;
  for (const PromptFocus& f : r.prompt_focus) {
    py::dict x;
    x["history"] = f.history;
    x["top4"] = f.top4;
    x["far4"] = f.far4;
    x["kl"] = f.kl;
    focus.append(x);
  }
  d["prompt_focus"] = focus;
  d["focus"] = focus_score(r.prompt_focus);
  d["adapted"] = r.adapted;
  size_t units = r.position_tiers.size(), n = units ? r.position_tiers[0].size() : 0;
  py::array_t<uint8_t> tiers({units, n});
  auto m = tiers.mutable_unchecked<2>();
  for (size_t u = 0; u < units; ++u)
    for (size_t i = 0; i < n; ++i)
      m(u, i) = i < r.position_tiers[u].size() ? uint8_t(r.position_tiers[u][i]) : uint8_t(3);
  d["tier_map"] = tiers;
  return d;
}

// What a generate call returns, in Model.generate and Session.generate: the text (without
// the stop token or string), the generated tokens, whether a stop ended it; the caller adds
// its own fields.
py::dict generated_dict(const std::string& text, const std::vector<int32_t>& tokens,
                        bool hit_stop) {
  py::dict d;
  d["text"] = text;
  d["tokens"] = tokens;
  d["hit_stop"] = hit_stop;
  return d;
}

// One turn's stats (engine/session.h's TurnStats).
py::dict turn_dict(const TurnStats& t) {
  py::dict d;
  d["prompt_tokens"] = t.prompt_tokens;
  d["reused_tokens"] = t.reused_tokens;
  d["generated"] = t.generated;
  d["prompt_seconds"] = t.prompt_seconds;
  d["decode_seconds"] = t.decode_seconds;
  d["promotions"] = t.promotions;
  d["demotions"] = t.demotions;
  d["evictions"] = t.evictions;
  d["bytes_held"] = t.bytes_held;
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
    const KvCacheParams p = kv_params(kv_policy, kv_budget, prefill_route, kv_score);
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
    py::dict d = generated_dict(tok_->decode(out), reqs[0].output, reqs[0].hit_stop);
    d["prompt_tokens"] = reqs[0].prompt.size();
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
    const KvCacheParams p = kv_params(kv_policy, kv_budget, prefill_route, "");
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

  Model& model() { return *model_; }
  Tokenizer& tok() { return *tok_; }
  ThreadPool& pool() { return pool_; }

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

// A conversation (engine/session.h): its cache and token history, extended turn by turn.
class PySession {
 public:
  PySession(PyModel& m, std::unique_ptr<Session> s) : m_(m), s_(std::move(s)) {}

  static std::unique_ptr<PySession> create(PyModel& m, int64_t n_ctx, int prefill_chunk,
                                           const py::kwargs& kw) {
    SessionOptions o;
    o.kv = kv_params(kw);
    o.n_ctx = n_ctx;
    o.prefill_chunk = prefill_chunk;
    auto s = Session::create(m.model(), o);
    if (!s) raise(s.error());
    return std::make_unique<PySession>(m, std::move(*s));
  }

  static std::unique_ptr<PySession> load(PyModel& m, const std::string& path) {
    Expected<std::unique_ptr<Session>> s = Status::error("");
    {
      py::gil_scoped_release release;
      s = Session::load(m.model(), path, m.pool());
    }
    if (!s) raise(s.error());
    return std::make_unique<PySession>(m, std::move(*s));
  }

  // Text (tokenized; BOS only at the start of the conversation; special-token text such as
  // <|im_start|> read as those tokens unless parse_special=False) or token ids.
  std::vector<int32_t> to_tokens(const py::object& input, bool parse_special) {
    if (input.is_none()) return {};
    if (py::isinstance<py::str>(input))
      return m_.tok().encode(input.cast<std::string>(), s_->tokens().empty(), parse_special);
    auto ids = input.cast<std::vector<int32_t>>();
    const int32_t n_vocab = m_.model().config().n_vocab;
    for (int32_t id : ids)
      if (id < 0 || id >= n_vocab)
        raise("token id " + std::to_string(id) + " is out of range [0, " + std::to_string(n_vocab) +
              ")");
    return ids;
  }

  py::dict append(const py::object& input, bool parse_special) {
    const std::vector<int32_t> turn = to_tokens(input, parse_special);
    if (turn.empty()) raise("append: the turn has no tokens");
    run([&] { return s_->append(turn, m_.pool()); });
    return turn_dict(s_->turns().back());
  }

  // Generates up to max_tokens after `input` (may be None when a generated token is pending).
  // stop: a string, or a list of strings (generation ends when the text contains one; the text
  // is cut before it) and token ids (stop tokens, beside the model's end-of-generation tokens
  // unless ignore_eos).
  py::dict generate(const py::object& input, int max_tokens, float temperature, int top_k,
                    float top_p, float min_p, int64_t seed, const py::object& stop, bool ignore_eos,
                    bool parse_special) {
    const std::vector<int32_t> turn = to_tokens(input, parse_special);
    Tokenizer& tok = m_.tok();
    std::vector<int32_t> stop_tokens;
    std::vector<std::string> stop_strings;
    if (!stop.is_none()) {
      const py::list items =
          py::isinstance<py::str>(stop) ? py::list(py::make_tuple(stop)) : py::list(stop);
      for (py::handle h : items) {
        if (py::isinstance<py::str>(h)) {
          const std::string s = h.cast<std::string>();
          if (s.empty()) raise("an empty stop string");
          stop_strings.push_back(s);
        } else {
          stop_tokens.push_back(h.cast<int32_t>());
        }
      }
    }
    if (!ignore_eos)
      for (int32_t id = 0; id < tok.n_vocab(); ++id)
        if (tok.is_eog(id)) stop_tokens.push_back(id);
    SamplingParams sp;
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
    if (Status st = sp.validate(); !st) raise(st.message());
    if (max_tokens < 0) raise("max_tokens must be >= 0");
    // The text so far, searched for the stop strings after every token.
    std::string text;
    size_t cut = std::string::npos;
    std::string matched;
    auto on_token = [&](int32_t id) {
      if (std::find(stop_tokens.begin(), stop_tokens.end(), id) != stop_tokens.end()) return true;
      const size_t from = text.size();
      text += tok.token_to_piece(id);
      for (const std::string& s : stop_strings) {
        const size_t at = text.find(s, from >= s.size() ? from - s.size() + 1 : 0);
        if (at != std::string::npos && at < cut) cut = at, matched = s;
      }
      return cut == std::string::npos;
    };
    Session::GenerateResult g;
    run([&] { return s_->generate(turn, max_tokens, sp, stop_tokens, m_.pool(), on_token, &g); });
    py::dict d = generated_dict(cut == std::string::npos ? text : text.substr(0, cut), g.tokens,
                                g.hit_stop || cut != std::string::npos);
    d["stop"] = matched.empty() ? py::object(py::none()) : py::object(py::str(matched));
    d["turn"] = turn_dict(s_->turns().back());
    return d;
  }

  std::string save(const std::string& path) {
    Session::SaveMode mode;
    run([&] { return s_->save(path, &mode); });
    return mode == Session::SaveMode::kState ? "state" : "tokens_only";
  }

  void rewind(int64_t n) {
    if (Status st = s_->rewind(n); !st) raise(st.message());
  }
  bool can_rewind(int64_t n) const { return s_->can_rewind(n); }

  py::dict cache() const {
    py::dict d = report_dict(s_->cache());
    d["n_past"] = s_->cache().n_past();
    d["n_ctx"] = s_->cache().n_ctx();
    return d;
  }
  const std::vector<int32_t>& tokens() const { return s_->tokens(); }
  std::string text() const { return m_.tok().decode(s_->tokens()); }
  py::list turns() const {
    py::list l;
    for (const TurnStats& t : s_->turns()) l.append(turn_dict(t));
    return l;
  }

 private:
  // Runs an engine call without the GIL; its error as ValueError.
  template <typename F>
  void run(F&& f) {
    Status st = Status::ok();
    {
      py::gil_scoped_release release;
      st = f();
    }
    if (!st) raise(st.message());
  }

  PyModel& m_;
  std::unique_ptr<Session> s_;
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
           py::arg("kv_budget") = py::none(), py::arg("prefill_route") = "", py::arg("chunk") = 512)
      // The Session keeps the Model alive (keep_alive: the session refers to its weights).
      .def(
          "session",
          [](PyModel& m, int64_t n_ctx, int prefill_chunk, const py::kwargs& kw) {
            return qevict::PySession::create(m, n_ctx, prefill_chunk, kw);
          },
          py::arg("n_ctx") = 4096, py::arg("prefill_chunk") = 512, py::keep_alive<0, 1>());
  using qevict::PySession;
  py::class_<PySession>(m, "Session")
      .def_static("load", &PySession::load, py::arg("model"), py::arg("path"),
                  py::keep_alive<0, 1>())
      .def("append", &PySession::append, py::arg("turn"), py::arg("parse_special") = true)
      .def("generate", &PySession::generate, py::arg("turn") = py::none(),
           py::arg("max_tokens") = 64, py::arg("temperature") = 0.0f, py::arg("top_k") = 40,
           py::arg("top_p") = 0.95f, py::arg("min_p") = 0.05f, py::arg("seed") = 0,
           py::arg("stop") = py::none(), py::arg("ignore_eos") = false,
           py::arg("parse_special") = true)
      .def("save", &PySession::save, py::arg("path"))
      .def("rewind", &PySession::rewind, py::arg("n"))
      .def("can_rewind", &PySession::can_rewind, py::arg("n"))
      .def_property_readonly("cache", &PySession::cache)
      .def_property_readonly("tokens", &PySession::tokens)
      .def_property_readonly("text", &PySession::text)
      .def_property_readonly("turns", &PySession::turns)
      .def("__len__", [](const PySession& s) { return s.tokens().size(); });
}
