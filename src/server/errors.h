// Error bodies in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, the type
// from the HTTP status (401 authentication_error, 429 rate_limit_error, 5xx server_error, any
// other invalid_request_error), param the offending request field or null, code null.
#pragma once

#include <string>

namespace qevict {

// OpenAI's error type for an HTTP status.
const char* openai_error_type(int status);

// The JSON body of an error response; `param` empty gives null.
std::string openai_error_body(int status, const std::string& message,
                              const std::string& param = "");

}  // namespace qevict
