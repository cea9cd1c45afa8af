// RoutingTrace (see routing_observer.h).
#include "kvcache/routing_observer.h"

#include <fmt/format.h>

namespace qevict {

Expected<std::unique_ptr<RoutingTrace>> RoutingTrace::open(const std::string& path) {
  std::unique_ptr<RoutingTrace> t(new RoutingTrace());
  if (Status st = t->file_.open(path); !st)
    return Status::error(fmt::format("cannot write the KV trace: {}", st.message()));
  return t;
}

RoutingTrace::~RoutingTrace() {
  if (Status st = file_.commit(); !st)
    std::fprintf(stderr, "warning: KV trace %s: %s\n", file_.path().c_str(), st.message().c_str());
}

void RoutingTrace::on_layer_routed(int64_t event, int64_t n_past, int layer, const WindowStore& s) {
  const int32_t n = s.n_windows(layer);
  std::string tiers(size_t(n), 'E'), scores;
  scores.reserve(size_t(n) * 8);
  for (int32_t id = 0; id < n; ++id) {
    tiers[size_t(id)] = tier_char(s.window(layer, id).tier);
    if (id) scores += ',';
    scores += fmt::format("{:.4g}", s.window(layer, id).score);
  }
  std::fprintf(file_.file(),
               "{\"event\":%lld,\"n_past\":%lld,\"layer\":%d,\"tiers\":\"%s\",\"scores\":[%s]}\n",
               (long long)event, (long long)n_past, layer, tiers.c_str(), scores.c_str());
}

}  // namespace qevict
