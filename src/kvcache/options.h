// The one parser of KV-cache options: `key=value` pairs typed and checked here, shared by the
// CLI (each --kv-* flag is a row of kv_options()), `qevict eval` variants (policy:key=value),
// the Python bindings (keyword arguments) and the server (request fields kv_<key>). A policy's
// defaults are applied afterwards, by finish_kv_params (its registry row), for the options the
// user did not set.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kvcache/params.h"

namespace qevict {

struct KvOptionInfo {
  std::string key;    // set_kv_option's key; Python keyword kv_<key>; request field kv_<key>
  std::string flag;   // the CLI flag (--kv-q)
  std::string alias;  // an older short key eval variants accept (route, vbits), or empty
  std::string value;  // what the value is, for help: "N", "FRACTION", "chunk|end"
  std::string help;   // one paragraph for --help and docs
  bool per_cache;     // only where one cache is made (generate, serve, ...), not in eval grids
  bool flag_only;     // a switch without a value on the CLI (value "1"/"0" elsewhere)
  // Parses `value` into p, marking `given`.
  std::function<Status(KvCacheParams* p, KvParamsGiven* given, const std::string& value)> set;
  // The value as set_kv_option would read it back (for --help defaults and reports).
  std::function<std::string(const KvCacheParams& p)> get;
};

// Every option, in the order of --help.
const std::vector<KvOptionInfo>& kv_options();
// The row of `key` (or its alias, or its flag), or null.
const KvOptionInfo* find_kv_option(const std::string& key);

// Sets one option from its text: errors name the option and what it accepts.
Status set_kv_option(KvCacheParams* p, KvParamsGiven* given, const std::string& key,
                     const std::string& value);

// key=value pairs in the order given: what a CLI, a variant or a request said.
using KvOptionList = std::vector<std::pair<std::string, std::string>>;

// A policy's row defaults for what `given` does not mark, then validation: the last step of
// every parser.
Status finish_kv_params(KvCacheParams* p, const KvParamsGiven& given);

// Defaults, then `opts` in order, then the row's defaults and validation.
Expected<KvCacheParams> make_kv_params(const KvOptionList& opts);

// "--kv-policy NAME" help: every registry row, one line each.
std::string kv_policy_help();

}  // namespace qevict
