// Session files (engine/session.h): a conversation's tokens and its cache's state, to disk and
// back. Layout, little-endian:
//   magic "QEVSESS\0" (8 bytes), u32 version (2), u32 reserved (0),
//   u64 payload bytes, u64 FNV-1a 64 checksum of the payload, then the payload:
//   u64 model fingerprint, model name, KV options (every KvCacheParams field that shapes the
//   cache), n_ctx, prefill chunk, the history's tokens, the cache's n_past, bytes by tier
//   (sink / full / low-bit, as --kv-stats reports them), a flag saying
//   whether the cache state follows, and the state (SequenceKvCache::save_state).
// Reading checks the magic, version, size, checksum and every field's range, and names what is
// wrong; the model's fingerprint is checked by Session::load against the loaded model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvcache/params.h"
#include "model/model.h"

namespace qevict {

// 2: adds the low-bit tier's key_meta after the quantizer options (1: read as key_meta 16);
// 3: adds --kv-adapt after it (1, 2: read as 0).
inline constexpr uint32_t kSessionFileVersion = 3;

struct SessionFileContents {
  uint64_t model_fingerprint = 0;
  std::string model_name;
  KvCacheParams kv;
  int64_t n_ctx = 0;
  int prefill_chunk = 512;
  std::vector<int32_t> tokens;
  int64_t cache_n_past = 0;
  size_t bytes_sink = 0, bytes_full = 0, bytes_quant = 0;
  bool has_state = false;
  std::string state;  // the cache's save_state() bytes (has_state)
};

// A 64-bit fingerprint of a model's weights: every tensor's name, shape, type and offset, and
// the first and last 4 KiB of its data. Equal for the same GGUF file, different for another
// model or another quantization of the same one.
uint64_t model_fingerprint(const Model& model);

std::string encode_session(const SessionFileContents& c);
// Parses a session file's bytes. verify_checksum false skips only the checksum (the fuzz
// target, so that it reaches the fields); every other check stays.
Expected<SessionFileContents> decode_session(const std::string& bytes, bool verify_checksum = true);

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace qevict
