// The body of an OpenAI request (POST /v1/chat/completions or /v1/completions), validated into
// plain data. Untrusted input: any byte string gives either a request or one error naming the
// field, never an exception (fuzzed by tests/fuzz/openai_request_fuzz.cpp). What the server
// does with it (the chat template, tokenization, the KV cache) is the caller's business.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "chat/chat_template.h"

namespace qevict {

enum class OpenAiEndpoint { kChat, kCompletions };

// A request whose fields have the right types and ranges. Defaults are OpenAI's, except
// max_tokens of a completion (16, OpenAI's old default) and of a chat (256: the API's "no limit"
// is the context, too long for a CPU server's default).
struct OpenAiRequest {
  bool chat = false;
  std::string model;                  // empty: not given (any value is served by the one model)
  std::string user;                   // names the conversation when no X-Session-Id is given
  std::vector<ChatMessage> messages;  // chat: roles system/user/assistant ("developer" → system)
  std::string prompt;                 // completions
  int64_t max_tokens = 16;            // [1, n_ctx]; max_completion_tokens is a synonym
  double temperature = 1.0;           // [0, 2]
  double top_p = 1.0;                 // [0, 1]
  double min_p = 0.0;                 // [0, 1] (llama-server's extension)
  int64_t top_k = 0;                  // [0, 2^20]; 0 = off
  int64_t seed = -1;                  // < 0: the server draws one
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool ignore_eos = false;               // llama-server's extension: generate through EOS
  std::vector<std::string> stop;         // up to 4 non-empty strings
  std::optional<std::string> kv_policy;  // extra field: the request's cache policy
  std::optional<double> kv_budget;       // extra field: (0, 1], a fraction of the full cache
  // Every other kv_<key> field (kv_q, kv_prefill_route, ...), as text, by key, the key without
  // "kv_": parsed by the shared KV option parser (kvcache/options.h) when the
  // request's cache is made, as the CLI's --kv-* flags are.
  std::vector<std::pair<std::string, std::string>> kv_options;
};

// A 400 in OpenAI's error shape: the message and the offending field (empty: the whole body).
struct OpenAiRequestError {
  std::string message;
  std::string param;
};

// Parses and checks `body` for `endpoint`. n_ctx bounds max_tokens. Unknown fields, wrong types
// and out-of-range values are errors (the message names the field and what it must be).
std::variant<OpenAiRequest, OpenAiRequestError> parse_openai_request(std::string_view body,
                                                                     OpenAiEndpoint endpoint,
                                                                     int64_t n_ctx);

}  // namespace qevict
