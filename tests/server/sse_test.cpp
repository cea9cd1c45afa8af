// The bytes of qevict serve's responses (src/server/sse.*): SSE chunks, [DONE], the usage
// chunk, mid-stream errors and whole responses. nlohmann::json writes keys in sorted order, so
// every body is one exact string.
#include "server/sse.h"

#include <gtest/gtest.h>

#include <string>

namespace qevict {
namespace {

using json = nlohmann::json;

CompletionHeader chat_header() { return {"chatcmpl-7", true, 1700000000, "smol", false}; }
CompletionHeader text_header() { return {"cmpl-3", false, 1700000001, "smol", true}; }

TEST(Sse, ChatChunks) {
  EXPECT_EQ(sse_chunk(chat_header(), json{{"role", "assistant"}, {"content", ""}}, nullptr),
            "data: "
            R"({"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,)"
            R"("index":0}],"created":1700000000,"id":"chatcmpl-7","model":"smol",)"
            R"("object":"chat.completion.chunk"})"
            "\n\n");
  EXPECT_EQ(sse_chunk(chat_header(), json{{"content", "Hi \"you\"\n"}}, nullptr),
            "data: "
            R"({"choices":[{"delta":{"content":"Hi \"you\"\n"},"finish_reason":null,"index":0}],)"
            R"("created":1700000000,"id":"chatcmpl-7","model":"smol",)"
            R"("object":"chat.completion.chunk"})"
            "\n\n");
  EXPECT_EQ(sse_chunk(chat_header(), json::object(), "stop"),
            "data: "
            R"({"choices":[{"delta":{},"finish_reason":"stop","index":0}],"created":1700000000,)"
            R"("id":"chatcmpl-7","model":"smol","object":"chat.completion.chunk"})"
            "\n\n");
}

TEST(Sse, CompletionChunksWithUsage) {
  EXPECT_EQ(sse_chunk(text_header(), json("caf\xC3\xA9"), nullptr),
            "data: "
            R"({"choices":[{"finish_reason":null,"index":0,"logprobs":null,"text":"café"}],)"
            R"("created":1700000001,"id":"cmpl-3","model":"smol","object":"text_completion",)"
            R"("usage":null})"
            "\n\n");
  EXPECT_EQ(sse_chunk(text_header(), json(""), "length"),
            "data: "
            R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":""}],)"
            R"("created":1700000001,"id":"cmpl-3","model":"smol","object":"text_completion",)"
            R"("usage":null})"
            "\n\n");
  EXPECT_EQ(sse_usage(text_header(), 7, 5),
            "data: "
            R"({"choices":[],"created":1700000001,"id":"cmpl-3","model":"smol",)"
            R"("object":"text_completion",)"
            R"("usage":{"completion_tokens":5,"prompt_tokens":7,"total_tokens":12}})"
            "\n\n");
}

TEST(Sse, DoneAndErrorEvents) {
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_error("out of memory"),
            "data: "
            R"({"error":{"message":"out of memory","type":"server_error"}})"
            "\n\n");
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(Sse, InvalidUtf8IsReplacedNotThrown) {
  // A token piece that can never complete a character (Utf8Streamer passes it through).
  EXPECT_EQ(sse_chunk(chat_header(), json{{"content", "a\xFF"}}, nullptr),
            "data: "
            R"({"choices":[{"delta":{"content":"a)"
            "\xEF\xBF\xBD"
            R"("},"finish_reason":null,"index":0}],"created":1700000000,"id":"chatcmpl-7",)"
            R"("model":"smol","object":"chat.completion.chunk"})"
            "\n\n");
}

TEST(Sse, WholeResponses) {
  EXPECT_EQ(completion_body(chat_header(), "Hello", "stop", 4, 3),
            R"({"choices":[{"finish_reason":"stop","index":0,)"
            R"("message":{"content":"Hello","role":"assistant"}}],"created":1700000000,)"
            R"("id":"chatcmpl-7","model":"smol","object":"chat.completion",)"
            R"("usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7}})");
  EXPECT_EQ(completion_body(text_header(), " world", "length", 2, 16),
            R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,)"
            R"("text":" world"}],"created":1700000001,"id":"cmpl-3","model":"smol",)"
            R"("object":"text_completion",)"
            R"("usage":{"completion_tokens":16,"prompt_tokens":2,"total_tokens":18}})");
  // With the prompt tokens reused from a conversation (OpenAI's prompt_tokens_details).
  EXPECT_EQ(completion_body(text_header(), " world", "length", 200, 16, 150),
            R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,)"
            R"("text":" world"}],"created":1700000001,"id":"cmpl-3","model":"smol",)"
            R"("object":"text_completion",)"
            R"("usage":{"completion_tokens":16,"prompt_tokens":200,)"
            R"("prompt_tokens_details":{"cached_tokens":150},"total_tokens":216}})");
  EXPECT_EQ(sse_usage(text_header(), 7, 5, 0),
            "data: "
            R"({"choices":[],"created":1700000001,"id":"cmpl-3","model":"smol",)"
            R"("object":"text_completion",)"
            R"("usage":{"completion_tokens":5,"prompt_tokens":7,)"
            R"("prompt_tokens_details":{"cached_tokens":0},"total_tokens":12}})"
            "\n\n");
}

}  // namespace
}  // namespace qevict
