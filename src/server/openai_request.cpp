// OpenAI request bodies → OpenAiRequest (see openai_request.h). nlohmann::json is used without
// exceptions: parse with allow_exceptions=false and read a value only after checking its type.
#include "server/openai_request.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

namespace qevict {

namespace {

using json = nlohmann::json;

// The fields a body may have: both endpoints' (OpenAI's and the extensions kv_policy, kv_budget,
// min_p, top_k, ignore_eos), then each endpoint's own.
bool known_field(const std::string& key, bool chat) {
  static const std::set<std::string> common = {
      "model",     "max_tokens", "temperature",       "top_p",
      "seed",      "stream",     "stream_options",    "stop",
      "n",         "user",       "kv_policy",         "kv_budget",
      "top_k",     "min_p",      "frequency_penalty", "presence_penalty",
      "ignore_eos"};
  if (common.count(key)) return true;
  if (key.rfind("kv_", 0) == 0 && key != "kv_trace") return true;  // kv_<key>: options.h
  return chat ? key == "messages" || key == "max_completion_tokens"
              : key == "prompt" || key == "echo";
}

// Reads the body field by field; the first problem found is kept in err.
class Reader {
 public:
  explicit Reader(const json& body) : body_(body) {}

  bool ok() const { return err_.message.empty(); }
  OpenAiRequestError take_error() { return std::move(err_); }

  bool fail(const std::string& field, const std::string& what) {
    if (ok()) err_ = {fmt::format("'{}' {}", field, what), field};
    return false;
  }

  // A present, non-null field.
  const json* field(const char* f) const {
    auto it = body_.find(f);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  void integer(const char* f, int64_t lo, int64_t hi, int64_t* out) {
    const json* v = field(f);
    if (!v || !ok()) return;
    // An unsigned value above INT64_MAX is an integer out of every range we accept.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
      fail(f, fmt::format("must be in [{}, {}]", lo, hi));
      return;
    }
    if (!v->is_number_integer()) {
      fail(f, "must be an integer");
      return;
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) {
      fail(f, fmt::format("must be in [{}, {}]", lo, hi));
      return;
    }
    *out = x;
  }

  void number(const char* f, double lo, double hi, double* out) {
    const json* v = field(f);
    if (!v || !ok()) return;
    if (!v->is_number()) {
      fail(f, "must be a number");
      return;
    }
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {  // NaN fails too
      fail(f, fmt::format("must be in [{}, {}]", lo, hi));
      return;
    }
    *out = x;
  }

  void boolean(const char* f, bool* out) {
    const json* v = field(f);
    if (!v || !ok()) return;
    if (!v->is_boolean()) {
      fail(f, "must be a boolean");
      return;
    }
    *out = v->get<bool>();
  }

 private:
  const json& body_;
  OpenAiRequestError err_;
};

// messages: [{"role": R, "content": "text" | [{"type": "text", "text": "..."}, ...]}, ...]
bool read_messages(const json& msgs, Reader& r, std::vector<ChatMessage>* out) {
  if (!msgs.is_array() || msgs.empty()) return r.fail("messages", "must be a non-empty array");
  for (const auto& m : msgs) {
    if (!m.is_object()) return r.fail("messages", "entries must be objects with a string 'role'");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string())
      return r.fail("messages", "entries must be objects with a string 'role'");
    const std::string role = role_it->get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      return r.fail("messages", fmt::format("unknown role '{}'", role));
    std::string content;
    auto c = m.find("content");
    if (c != m.end() && c->is_string()) {
      content = c->get<std::string>();
    } else if (c != m.end() && c->is_array()) {
      for (const auto& part : *c) {
        auto type = part.is_object() ? part.find("type") : part.end();
        auto text = part.is_object() ? part.find("text") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() ||
            type->get<std::string>() != "text" || text == part.end() || !text->is_string())
          return r.fail("messages", "content parts must be {\"type\": \"text\", \"text\": ...}");
        content += text->get<std::string>();
      }
    } else {
      return r.fail("messages", "each message needs a string 'content'");
    }
    out->push_back({role == "developer" ? "system" : role, std::move(content)});
  }
  return true;
}

}  // namespace

std::variant<OpenAiRequest, OpenAiRequestError> parse_openai_request(std::string_view body_text,
                                                                     OpenAiEndpoint endpoint,
                                                                     int64_t n_ctx) {
  const json body = json::parse(body_text.begin(), body_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (body.is_discarded()) return OpenAiRequestError{"the body is not valid JSON", ""};
  if (!body.is_object()) return OpenAiRequestError{"the body must be a JSON object", ""};
  OpenAiRequest q;
  q.chat = endpoint == OpenAiEndpoint::kChat;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known_field(it.key(), q.chat))
      return OpenAiRequestError{fmt::format("unknown field '{}'", it.key()), it.key()};

  Reader r(body);
  if (const json* m = r.field("model")) {
    if (!m->is_string()) return OpenAiRequestError{"'model' must be a string", "model"};
    q.model = m->get<std::string>();
  }
  if (const json* u = r.field("user")) {
    if (!u->is_string()) return OpenAiRequestError{"'user' must be a string", "user"};
    q.user = u->get<std::string>();
  }
  q.max_tokens = q.chat ? 256 : 16;
  int64_t n = 1;
  r.integer("max_tokens", 1, n_ctx, &q.max_tokens);
  r.integer("max_completion_tokens", 1, n_ctx, &q.max_tokens);
  r.integer("n", 1, 1, &n);
  r.integer("seed", INT64_MIN, INT64_MAX, &q.seed);
  r.integer("top_k", 0, int64_t(1) << 20, &q.top_k);
  r.number("temperature", 0.0, 2.0, &q.temperature);
  r.number("top_p", 0.0, 1.0, &q.top_p);
  r.number("min_p", 0.0, 1.0, &q.min_p);
  double penalty = 0.0;  // accepted at their neutral value only
  r.number("frequency_penalty", 0.0, 0.0, &penalty);
  r.number("presence_penalty", 0.0, 0.0, &penalty);
  if (auto e = body.find("echo"); e != body.end() && !(e->is_boolean() && !e->get<bool>()))
    r.fail("echo", "is not supported (false only)");
  r.boolean("ignore_eos", &q.ignore_eos);
  r.boolean("stream", &q.stream);
  if (const json* so = r.field("stream_options"); so && r.ok()) {
    if (!so->is_object()) {
      r.fail("stream_options", "must be an object");
    } else if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean())
        r.fail("stream_options", "'include_usage' must be a boolean");
      else
        q.include_usage = iu->get<bool>();
    }
  }
  if (const json* s = r.field("stop"); s && r.ok()) {
    const char* what = "must be a string or up to 4 strings";
    if (s->is_string()) {
      q.stop.push_back(s->get<std::string>());
    } else if (s->is_array() && s->size() <= 4) {
      for (const auto& x : *s) {
        if (!x.is_string()) {
          r.fail("stop", what);
          break;
        }
        q.stop.push_back(x.get<std::string>());
      }
    } else {
      r.fail("stop", what);
    }
    for (const auto& x : q.stop)
      if (x.empty()) r.fail("stop", "strings must not be empty");
  }
  if (auto p = body.find("kv_policy"); p != body.end() && r.ok()) {
    if (!p->is_string())
      r.fail("kv_policy", "must be a string");
    else
      q.kv_policy = p->get<std::string>();
  }
  if (auto b = body.find("kv_budget"); b != body.end() && r.ok()) {
    const double x = b->is_number() ? b->get<double>() : -1.0;
    if (!(x > 0.0 && x <= 1.0))
      r.fail("kv_budget", "must be a number in (0, 1]");
    else
      q.kv_budget = x;
  }
  for (auto it = body.begin(); it != body.end() && r.ok(); ++it) {
    const std::string& key = it.key();
    if (key.rfind("kv_", 0) != 0 || key == "kv_policy" || key == "kv_budget") continue;
    const json& v = *it;
    if (v.is_string())
      q.kv_options.emplace_back(key.substr(3), v.get<std::string>());
    else if (v.is_boolean())
      q.kv_options.emplace_back(key.substr(3), v.get<bool>() ? "1" : "0");
    else if (v.is_number())
      q.kv_options.emplace_back(key.substr(3), v.dump());
    else
      r.fail(key, "must be a string, a number or a boolean");
  }
  if (!r.ok()) return r.take_error();
  if (q.chat) {
    auto m = body.find("messages");
    if (m == body.end())
      return OpenAiRequestError{"'messages' must be a non-empty array", "messages"};
    if (!read_messages(*m, r, &q.messages)) return r.take_error();
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !p->is_string())
      return OpenAiRequestError{"'prompt' must be a string", "prompt"};
    q.prompt = p->get<std::string>();
  }
  return q;
}

}  // namespace qevict
