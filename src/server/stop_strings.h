// Stop strings of an OpenAI request ("stop": up to 4 strings), matched on the generated text as
// it grows token by token. A stop string may be split over several tokens, and a token may end
// inside a multi-byte UTF-8 character, so the matcher keeps the whole text (complete characters
// only, tokenizer/tokenizer.h's Utf8Streamer) and, for streaming, holds back a tail that could
// still be the start of a stop string until the next tokens tell.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qevict {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Adds a token's bytes. True when a stop string was hit: the text then ends before it, and
  // later calls change nothing.
  bool add(std::string_view token_bytes);
  // The generation ended (end of generation, max_tokens): bytes of an incomplete character
  // held by the UTF-8 streamer join the text, and nothing is held back any more.
  void flush();
  // The text not taken yet, less a tail that may still begin a stop string (nothing is held
  // once stopped or flushed).
  std::string take();

  const std::string& text() const { return text_; }  // everything final so far
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  Utf8Streamer utf8_;
  std::string text_;
  size_t sent_ = 0;  // bytes of text_ returned by take()
  bool stopped_ = false;
  bool ended_ = false;  // flush() was called
};

}  // namespace qevict
