// Stop strings across token boundaries (see stop_strings.h).
#include "server/stop_strings.h"

#include <algorithm>

namespace qevict {

bool StopStringMatcher::add(std::string_view token_bytes) {
  if (stopped_) return true;
  text_ += utf8_.push(token_bytes);
  // The earliest match of any stop string ends the text (one token may complete two). A stop
  // string cannot start inside text already taken (take() holds back every tail that could
  // begin one); the search starts a stop string's length before it all the same.
  size_t cut = std::string::npos;
  for (const auto& s : stops_)
    cut = std::min(cut, text_.find(s, sent_ > s.size() ? sent_ - s.size() : 0));
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  stopped_ = true;
  return true;
}

void StopStringMatcher::flush() {
  if (!stopped_) text_ += utf8_.flush();
  ended_ = true;
}

std::string StopStringMatcher::take() {
  size_t hold = 0;  // the longest tail of the text that is a proper prefix of a stop string
  if (!stopped_ && !ended_)
    for (const auto& s : stops_)
      for (size_t k = std::min(s.size() - 1, text_.size() - sent_); k > hold; --k)
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
  const size_t end = text_.size() - hold;
  std::string out = end > sent_ ? text_.substr(sent_, end - sent_) : std::string();
  sent_ = std::max(sent_, end);
  return out;
}

}  // namespace qevict
