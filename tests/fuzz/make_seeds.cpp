// Writes the GGUF seed corpus of the gguf_fuzz target (tests/fuzz/corpus/gguf_fuzz/) with the
// test GGUF builder: a toy tokenizer vocabulary with a chat template, a small model-like file
// with tensors of several types, metadata of every value type, version 2 with a custom
// alignment, and an empty file. With a second directory, also the seeds of session_file_fuzz
// (tests/fuzz/corpus/session_file_fuzz/): session files written by encode_session with the
// states of the target's toy caches (session_toy.h) after 40 tokens — a FullKvCache, a tiered
// cache that has routed windows into every tier — and a tokens-only file.
// Usage: qevict_fuzz_seeds OUT_DIR [SESSION_OUT_DIR]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/gguf_builder.h"
#include "core/byte_io.h"
#include "core/thread_pool.h"
#include "engine/session_file.h"
#include "fuzz/fuzz_vocab.h"
#include "fuzz/session_toy.h"
#include "gguf/ggml_types.h"

namespace {

using qevict::GgmlType;
using qevict::GgufValueType;
using qevict::test::GgufBuilder;

bool write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

std::vector<uint8_t> zeros(size_t n) { return std::vector<uint8_t>(n, 0x11); }

// n tokens of random keys, values and queries through `c`, in calls of 8, the prompt ended.
bool fill(qevict::SequenceKvCache& c, int n, qevict::ThreadPool& pool) {
  const qevict::KvShape s = qevict::fuzz::session_shape();
  std::mt19937 rng(50);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int done = 0; done < n; done += 8) {
    const int k = std::min(8, n - done);
    std::vector<float> q(size_t(k) * s.q_width()), kv(size_t(k) * s.kv_width()), v(kv.size()),
        out(q.size());
    if (!c.begin(k).is_ok()) return false;
    for (int l = 0; l < s.n_layers; ++l) {
      for (float& x : q) x = d(rng);
      for (float& x : kv) x = d(rng);
      for (float& x : v) x = d(rng);
      c.attend(l, q.data(), kv.data(), v.data(), out.data(), pool);
    }
    if (!c.commit().is_ok()) return false;
  }
  return c.end_prompt().is_ok();
}

bool session_seed(qevict::SequenceKvCache* c, const qevict::KvCacheParams& p, int n_tokens,
                  std::vector<uint8_t>* out) {
  qevict::SessionFileContents f;
  f.model_fingerprint = 0x5eed;
  f.model_name = "toy";
  f.kv = p;
  f.n_ctx = qevict::fuzz::kSessionCtx;
  f.prefill_chunk = 8;
  for (int i = 0; i < n_tokens; ++i) f.tokens.push_back(i % 7 + 1);
  f.cache_n_past = c ? c->n_past() : 0;
  if (c) {
    qevict::ByteWriter w;
    if (!c->save_state(w).is_ok()) return false;
    f.has_state = true;
    f.state = w.bytes();
  }
  const std::string b = qevict::encode_session(f);
  out->assign(b.begin(), b.end());
  return true;
}

// The session_file_fuzz seeds.
bool session_seeds(std::vector<std::pair<std::string, std::vector<uint8_t>>>* seeds) {
  qevict::ThreadPool pool(1);
  auto full = qevict::fuzz::make_session_full();
  auto tiered = qevict::fuzz::make_session_tiered();
  auto tp = qevict::make_kv_params(qevict::fuzz::session_tiered_options());
  if (!tiered || !tp || !fill(*full, 40, pool) || !fill(*tiered, 40, pool)) return false;
  qevict::KvReport rep;
  tiered->report(&rep);
  if (rep.total().bytes_quant == 0) {
    std::fprintf(stderr, "the tiered seed has no low-bit window\n");
    return false;
  }
  std::vector<uint8_t> b;
  if (!session_seed(full.get(), qevict::KvCacheParams{}, 40, &b)) return false;
  seeds->emplace_back("full_40", b);
  if (!session_seed(tiered.get(), *tp, 40, &b)) return false;
  seeds->emplace_back("tiered_40", b);
  if (!session_seed(nullptr, *tp, 12, &b)) return false;
  seeds->emplace_back("tokens_only", b);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR [SESSION_OUT_DIR]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
  seeds.emplace_back("toy_vocab_smollm", qevict::fuzz::toy_vocab_gguf("smollm", chatml));

  GgufBuilder model;
  model.add_string("general.architecture", "llama")
      .add_u32("llama.context_length", 2048)
      .add_u32("llama.embedding_length", 64)
      .add_u32("llama.block_count", 1)
      .add_u32("llama.attention.head_count", 4)
      .add_u32("llama.attention.head_count_kv", 2)
      .add_f32("llama.rope.freq_base", 10000.0f)
      .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
      .add_tensor("token_embd.weight", {64, 8}, GgmlType::kQ8_0, zeros(8 * 2 * 34))
      .add_tensor("output_norm.weight", {64}, GgmlType::kF32, zeros(64 * 4))
      .add_tensor("blk.0.attn_q.weight", {64, 64}, GgmlType::kQ4_0, zeros(64 * 2 * 18))
      .add_tensor("blk.0.attn_k.weight", {64, 32}, GgmlType::kQ4_1, zeros(32 * 2 * 20))
      .add_tensor("blk.0.attn_v.weight", {64, 32}, GgmlType::kF16, zeros(32 * 64 * 2))
      .add_tensor("blk.0.ffn_up.weight", {256, 2}, GgmlType::kQ4_K, zeros(2 * 144))
      .add_tensor("blk.0.ffn_down.weight", {256, 1, 1, 1}, GgmlType::kQ6_K, zeros(210));
  seeds.emplace_back("model_like", model.build().bytes);

  GgufBuilder all_types;
  all_types.add_u8("t.u8", 200)
      .add_i8("t.i8", -100)
      .add_u16("t.u16", 60000)
      .add_i16("t.i16", -30000)
      .add_u32("t.u32", 4000000000u)
      .add_i32("t.i32", -2000000000)
      .add_u64("t.u64", 18000000000000000000ull)
      .add_i64("t.i64", -9000000000000000000ll)
      .add_f32("t.f32", 3.5f)
      .add_f64("t.f64", -2.25)
      .add_bool("t.bool", true)
      .add_string("t.str", "h\xc3\xa9llo")
      .add_array("t.arr_i32", GgufValueType::kInt32, std::vector<int32_t>{1, -2, 3})
      .add_array("t.arr_f32", GgufValueType::kFloat32, std::vector<float>{0.5f, 1.5f})
      .add_array("t.arr_u64", GgufValueType::kUint64, std::vector<uint64_t>{7})
      .add_string_array("t.arr_str", {"a", "", "ccc"})
      .add_tensor("x", {4}, GgmlType::kI8, zeros(4));
  seeds.emplace_back("all_value_types", all_types.build().bytes);

  GgufBuilder v2;
  v2.version(2)
      .alignment(64)
      .add_string("general.name", "v2")
      .add_tensor("w", {32, 2}, GgmlType::kBF16, zeros(128));
  seeds.emplace_back("v2_align64", v2.build().bytes);

  seeds.emplace_back("empty", GgufBuilder().build().bytes);

  auto write_all = [](const std::string& dir, const auto& seeds) {
    for (const auto& [name, bytes] : seeds) {
      if (!write(dir + "/" + name, bytes)) {
        std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
        return false;
      }
      std::printf("%s/%s: %zu bytes\n", dir.c_str(), name.c_str(), bytes.size());
    }
    return true;
  };
  if (!write_all(dir, seeds)) return 1;
  if (argc == 3) {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> sessions;
    if (!session_seeds(&sessions)) {
      std::fprintf(stderr, "cannot make the session seeds\n");
      return 1;
    }
    if (!write_all(argv[2], sessions)) return 1;
  }
  return 0;
}
