// libFuzzer target: the session file loader (engine/session_file.h, issue 50). decode_session
// runs without the checksum (which would reject almost every mutation before the fields are
// read); a file that parses has its cache state loaded into a toy FullKvCache and a toy
// tiered cache (session_toy.h). A damaged or hostile file must give an error — never a crash, a
// read past the end, or an allocation its size does not justify.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/byte_io.h"
#include "engine/session_file.h"
#include "fuzz/session_toy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto c = qevict::decode_session(bytes, /*verify_checksum=*/false);
  if (!c || !c->has_state) return 0;
  // Both caches read every state, whichever cache wrote it: a tiered state into a FullKvCache
  // (and the reverse) must be refused cleanly too.
  for (int kind = 0; kind < 2; ++kind) {
    auto cache =
        kind == 0 ? qevict::fuzz::make_session_full() : qevict::fuzz::make_session_tiered();
    if (!cache) __builtin_trap();  // the toy options are fixed: they must build
    qevict::ByteReader r(c->state);
    if (cache->load_state(r).is_ok()) {
      // A state that loads describes a usable cache.
      if (cache->n_past() < 0 || cache->n_past() > cache->n_ctx()) __builtin_trap();
      (void)cache->bytes_held();
      qevict::KvReport rep;
      cache->report(&rep, qevict::ReportDetail::kTiers);
    }
  }
  return 0;
}
