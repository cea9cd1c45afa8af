// OpenAI error bodies of qevict serve (src/server/errors.*): the type each status gets and the
// exact JSON (keys sorted by nlohmann::json).
#include "server/errors.h"

#include <gtest/gtest.h>

namespace qevict {
namespace {

TEST(ErrorBodies, TypeByStatus) {
  EXPECT_STREQ(openai_error_type(400), "invalid_request_error");
  EXPECT_STREQ(openai_error_type(401), "authentication_error");
  EXPECT_STREQ(openai_error_type(404), "invalid_request_error");
  EXPECT_STREQ(openai_error_type(413), "invalid_request_error");
  EXPECT_STREQ(openai_error_type(429), "rate_limit_error");
  EXPECT_STREQ(openai_error_type(500), "server_error");
  EXPECT_STREQ(openai_error_type(503), "server_error");
}

TEST(ErrorBodies, ExactJson) {
  EXPECT_EQ(openai_error_body(400, "'top_p' must be in [0, 1]", "top_p"),
            R"({"error":{"code":null,"message":"'top_p' must be in [0, 1]","param":"top_p",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(openai_error_body(404, "no such endpoint"),
            R"({"error":{"code":null,"message":"no such endpoint","param":null,)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(openai_error_body(401, "invalid or missing API key (Authorization: Bearer KEY)"),
            R"({"error":{"code":null,)"
            R"x("message":"invalid or missing API key (Authorization: Bearer KEY)",)x"
            R"("param":null,"type":"authentication_error"}})");
  EXPECT_EQ(openai_error_body(429, "queue full"),
            R"({"error":{"code":null,"message":"queue full","param":null,)"
            R"("type":"rate_limit_error"}})");
  EXPECT_EQ(openai_error_body(503, "server shutting down"),
            R"({"error":{"code":null,"message":"server shutting down","param":null,)"
            R"("type":"server_error"}})");
  EXPECT_EQ(openai_error_body(500, "bad \xFF"), R"({"error":{"code":null,"message":"bad )"
                                                "\xEF\xBF\xBD"
                                                R"(","param":null,"type":"server_error"}})");
}

}  // namespace
}  // namespace qevict
