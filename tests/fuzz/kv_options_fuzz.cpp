// libFuzzer target: the KV option parser (kvcache/options.h), which reads user text from the
// CLI, eval variants, the Python bindings and server requests, and what its results feed: the
// policy's defaults and validation (finish_kv_params) and the budget (compute_budget) on a
// SmolLM2-shaped cache. Any text must give a value or an error — never a crash, an uncaught
// exception or undefined behaviour.
// Input: lines "key=value" (split at the first '='; a line without one is a key with an empty
// value), applied in order to one KvCacheParams; a line whose option is refused is skipped.
// Checked beyond the sanitizers: a refusal has a message; an option that was set reads back
// (KvOptionInfo::get) as text that set_kv_option accepts and that reads back the same; a
// windowed budget's bytes add up (total = sink + local + history, capacities >= 0).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/kv_shape.h"
#include "kvcache/budget.h"
#include "kvcache/options.h"
#include "kvcache/registry.h"
#include "kvcache/shape.h"

namespace {

using qevict::KvCacheParams;
using qevict::KvParamsGiven;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "kv_options_fuzz: %s\n", what.c_str());
  std::abort();
}

// SmolLM2-135M's cache (the test model): 30 layers, 9 query heads over 3 KV heads of 64.
qevict::KvShape smollm2_shape() { return qevict::test::rope_shape(30, 9, 3, 64); }

// Sets key=value; when it is accepted, its read-back must be accepted and stable.
void set_and_read_back(KvCacheParams* p, KvParamsGiven* given, const std::string& key,
                       const std::string& value) {
  const qevict::Status s = qevict::set_kv_option(p, given, key, value);
  if (!s) {
    if (s.message().empty()) fail("a refusal without a message for '" + key + "'");
    return;
  }
  const qevict::KvOptionInfo* o = qevict::find_kv_option(key);
  if (!o) fail("'" + key + "' was accepted but has no row");
  const std::string text = o->get(*p);
  KvCacheParams copy = *p;
  KvParamsGiven given_copy = *given;
  if (const qevict::Status r = o->set(&copy, &given_copy, text); !r)
    fail("'" + key + "' reads back as '" + text + "', which it refuses: " + r.message());
  if (o->get(copy) != text)
    fail("'" + key + "' reads back as '" + text + "', then as '" + o->get(copy) + "'");
}

void check_budget(const KvCacheParams& p, int64_t n_ctx) {
  const qevict::PolicyInfo* row = qevict::find_policy(p.policy);
  if (!row) fail("validated params with an unknown policy '" + p.policy + "'");
  auto b = qevict::compute_budget(row->kind, smollm2_shape(), n_ctx, p);
  if (!b) {
    if (b.error().empty()) fail("a budget refused without a message");
    return;
  }
  (void)b->describe();
  if (b->kind != qevict::CacheKind::kWindowed) return;
  if (b->total != b->sink_bytes + b->local_bytes + b->hist_bytes)
    fail("windowed budget: total != sink + local + history: " + b->describe());
  if (b->capacity_full < 0 || b->capacity_quant < 0)
    fail("windowed budget: a negative capacity: " + b->describe());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  KvCacheParams p;
  KvParamsGiven given;
  int lines = 0;
  while (!in.empty() && lines++ < 64) {
    const size_t nl = in.find('\n');
    const std::string_view line = in.substr(0, nl);
    in = nl == std::string_view::npos ? std::string_view{} : in.substr(nl + 1);
    const size_t eq = line.find('=');
    const std::string key(line.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? std::string_view{}
                                                         : line.substr(eq + 1));
    set_and_read_back(&p, &given, key, value);
  }
  if (!qevict::finish_kv_params(&p, given)) return 0;
  // A context below every fixed region (the floors) and SmolLM2's own.
  for (int64_t n_ctx : {int64_t(1), int64_t(8192)}) check_budget(p, n_ctx);
  return 0;
}
