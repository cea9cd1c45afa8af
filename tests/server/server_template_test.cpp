// The server's chat template (src/server/server_template.*): the model's template when it
// parses; ChatML, a start-up warning naming the model and the error, and the error in
// GET /health when it does not (llama-server's behaviour); ChatML without a warning when the
// model has none.
#include "server/server_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qevict {
namespace {

const std::vector<ChatMessage> kMsgs = {{"system", "Be brief."}, {"user", "Hi"}};
const char* kChatml =
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\n";

TEST(ServerChatTemplate, ModelTemplateIsUsed) {
  const ServerChatTemplate t(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}");
  EXPECT_STREQ(t.kind(), "model");
  EXPECT_EQ(t.parse_error(), "");
  EXPECT_EQ(t.startup_warning("smol.gguf"), "");
  EXPECT_EQ(t.health_body(), R"({"chat_template":"model","status":"ok"})");
  auto r = t.render(kMsgs, "<s>", "</s>");
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(*r, "<s>[system]Be brief.[user]Hi[assistant]");
}

TEST(ServerChatTemplate, NoTemplateIsChatmlWithoutWarning) {
  const ServerChatTemplate t("");
  EXPECT_STREQ(t.kind(), "chatml");
  EXPECT_EQ(t.startup_warning("smol.gguf"), "");
  EXPECT_EQ(t.health_body(), R"({"chat_template":"chatml","status":"ok"})");
  auto r = t.render(kMsgs, "<s>", "</s>");
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, kChatml);
}

TEST(ServerChatTemplate, TemplateThatFailsToParseWarnsAndFallsBackToChatml) {
  const std::string bad = "{% for m in messages %}{{ m.content }}";  // no endfor
  auto direct = ChatTemplate::parse(bad);
  ASSERT_FALSE(direct);
  const std::string err = direct.error();
  ASSERT_NE(err.find("chat template: line 1"), std::string::npos) << err;

  const ServerChatTemplate t(bad);
  EXPECT_STREQ(t.kind(), "chatml");
  EXPECT_EQ(t.parse_error(), err);
  EXPECT_EQ(t.startup_warning("broken.gguf"),
            "warning: the chat template of broken.gguf does not parse (" + err +
                "); chat requests fall back to ChatML");
  EXPECT_EQ(t.health_body(),
            R"({"chat_template":"chatml","chat_template_error":")" + err + R"(","status":"ok"})");
  auto r = t.render(kMsgs, "<s>", "</s>");
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, kChatml);
}

TEST(ServerChatTemplate, RenderErrorsOfTheModelTemplateAreReturned) {
  const ServerChatTemplate t("{{ raise_exception('no system role') }}");
  auto r = t.render(kMsgs, "", "");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("no system role"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace qevict
