// ModelConfig from GGUF metadata (key names per ggml's docs/gguf.md and llama.cpp's
// llama-arch.cpp).
#include "model/config.h"

#include <fmt/format.h>

namespace qevict {

Expected<ModelConfig> ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) return arch.status();
  c.arch = *arch;
  if (c.arch != "llama" && c.arch != "qwen2")
    return Status::error(fmt::format("{}: unsupported architecture '{}' (supported: llama, qwen2)",
                                     f.path(), c.arch));
  const std::string a = c.arch + ".";
  c.name = f.get_string_or("general.name", "");
  auto req = [&](const std::string& key, int* out) -> Status {
    auto v = f.get_int(a + key);
    if (!v) return v.status();
    if (*v <= 0 || *v > (int64_t(1) << 30))
      return Status::error(fmt::format("{}: {}{} = {} is out of range", f.path(), a, key, *v));
    *out = static_cast<int>(*v);
    return Status::ok();
  };
  QEVICT_RETURN_IF_ERROR(req("block_count", &c.n_layers));
  QEVICT_RETURN_IF_ERROR(req("embedding_length", &c.n_embd));
  QEVICT_RETURN_IF_ERROR(req("feed_forward_length", &c.n_ff));
  QEVICT_RETURN_IF_ERROR(req("attention.head_count", &c.n_heads));
  c.n_kv_heads = static_cast<int>(f.get_int_or(a + "attention.head_count_kv", c.n_heads));
  c.head_dim = static_cast<int>(
      f.get_int_or(a + "attention.key_length", c.n_heads > 0 ? c.n_embd / c.n_heads : 0));
  c.n_ctx_train = static_cast<int>(f.get_int_or(a + "context_length", 2048));
  c.norm_eps = static_cast<float>(f.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  int64_t n_vocab = f.get_int_or(a + "vocab_size", 0);
  if (n_vocab == 0) {
    if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"))
      n_vocab = static_cast<int64_t>(toks->arr.size());
  }
  c.n_vocab = static_cast<int>(n_vocab);
  c.rope.style = c.arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kNormal;
  c.rope.n_rot = static_cast<int>(f.get_int_or(a + "rope.dimension_count", c.head_dim));
  c.rope.freq_base = static_cast<float>(f.get_float_or(a + "rope.freq_base", 10000.0));
  const std::string scaling = f.get_string_or(a + "rope.scaling.type", "none");
  if (scaling == "linear") {
    const double factor = f.get_float_or(a + "rope.scaling.factor", 1.0);
    c.rope.freq_scale = factor > 0 ? static_cast<float>(1.0 / factor) : 1.0f;
  } else if (scaling != "none") {
    return Status::error(fmt::format("{}: unsupported rope scaling '{}'", f.path(), scaling));
  }
  c.qkv_bias = c.arch == "qwen2";
  QEVICT_RETURN_IF_ERROR(c.validate());
  return c;
}

Status ModelConfig::validate() const {
  if (n_layers <= 0 || n_embd <= 0 || n_ff <= 0 || n_heads <= 0 || n_kv_heads <= 0 ||
      head_dim <= 0 || n_vocab <= 0)
    return Status::error("model config has a zero or negative size");
  if (n_heads % n_kv_heads != 0)
    return Status::error(
        fmt::format("head_count {} is not a multiple of head_count_kv {}", n_heads, n_kv_heads));
  if (rope.n_rot <= 0 || rope.n_rot > head_dim || rope.n_rot % 2)
    return Status::error(
        fmt::format("rope dimension {} invalid for head_dim {}", rope.n_rot, head_dim));
  if (!(rope.freq_base > 0.0f)) return Status::error("rope.freq_base must be positive");
  return Status::ok();
}

}  // namespace qevict
