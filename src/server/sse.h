// The bodies of OpenAI completions, streamed (server-sent events: "data: JSON\n\n" per chunk,
// "data: [DONE]\n\n" at the end) or whole. A chat chunk carries a "delta" (the first one
// {"role": "assistant", "content": ""}, then {"content": piece}, the last {}); a completion
// chunk carries "text" and "logprobs": null. With stream_options.include_usage every chunk has
// "usage": null and one more chunk with no choices carries the usage before [DONE] (OpenAI's
// shape). Strings that are not valid UTF-8 are written with U+FFFD in place of bad bytes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace qevict {

// What every chunk of one response repeats.
struct CompletionHeader {
  std::string id;  // "chatcmpl-N" / "cmpl-N"
  bool chat = false;
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool include_usage = false;  // streaming: stream_options.include_usage
};

// {"prompt_tokens", "completion_tokens", "total_tokens"}, and when cached_tokens >= 0
// "prompt_tokens_details": {"cached_tokens": N} (prompt tokens reused, not processed again).
nlohmann::json openai_usage(int64_t prompt_tokens, int64_t completion_tokens,
                            int64_t cached_tokens = -1);

// One server-sent event: "data: " + data + "\n\n".
std::string sse_event(const nlohmann::json& data);
// The end of a stream: "data: [DONE]\n\n".
std::string sse_done();

// A streamed chunk: `content` is the chat delta object or the completion's text; `finish` the
// finish reason or null.
std::string sse_chunk(const CompletionHeader& h, const nlohmann::json& content,
                      const nlohmann::json& finish);
// The usage chunk of include_usage (no choices).
std::string sse_usage(const CompletionHeader& h, int64_t prompt_tokens, int64_t completion_tokens,
                      int64_t cached_tokens = -1);
// An error in the middle of a stream (the status line is long gone): an event with
// {"error": {"message", "type": "server_error"}}.
std::string sse_error(const std::string& message);

// A whole (non-streamed) response: "chat.completion" with a message, or "text_completion".
std::string completion_body(const CompletionHeader& h, const std::string& text,
                            const std::string& finish, int64_t prompt_tokens,
                            int64_t completion_tokens, int64_t cached_tokens = -1);

}  // namespace qevict
