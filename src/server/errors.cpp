// OpenAI-style error bodies (see errors.h).
#include "server/errors.h"

#include <nlohmann/json.hpp>

namespace qevict {

const char* openai_error_type(int status) {
  return status == 401   ? "authentication_error"
         : status == 429 ? "rate_limit_error"
         : status >= 500 ? "server_error"
                         : "invalid_request_error";
}

std::string openai_error_body(int status, const std::string& message, const std::string& param) {
  using json = nlohmann::json;
  const json e = {{"error",
                   {{"message", message},
                    {"type", openai_error_type(status)},
                    {"param", param.empty() ? json(nullptr) : json(param)},
                    {"code", json(nullptr)}}}};
  return e.dump(-1, ' ', false, json::error_handler_t::replace);  // invalid UTF-8: U+FFFD
}

}  // namespace qevict
