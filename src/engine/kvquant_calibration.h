// KVQuant's offline calibration (kvcache/quantizers/kvquant_policy.h) for a model: the model reads
// a calibration text through a cache that records every layer's keys (rotated back to pre-RoPE,
// as the reference's k_proj hook sees them) and values, then each layer is fitted
// (kvquant_calibrate). The reference calibrates on 16 samples of 2,048 wikitext tokens; here one
// sample of up to 2,048 tokens of a committed public-domain text (engine/data/
// kvquant_calibration.txt: Chapter 5 of the Jargon File, disjoint from the fidelity texts).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kvcache/quantizers/kvquant_policy.h"
#include "model/model.h"

namespace qevict {

// The committed calibration text (compiled in).
std::string_view kvquant_calibration_text();

using KvQuantCalibration = std::vector<KvQuantLayerCalib>;

// Runs `model` over `tokens` (prefill, in chunks of 256) and fits one calibration per layer for
// config `c`. Needs at least 16 tokens. `dump_dir` non-empty: also writes every layer's
// recorded activations there, kvquant_calib_L{l}_{k,v}.npy, f32 [n][kv_width] (keys pre-RoPE),
// for tools/faithfulness/kvquant_numpy.py.
Expected<std::shared_ptr<const KvQuantCalibration>> kvquant_calibration(
    Model& model, const std::vector<int32_t>& tokens, const KvQuantConfig& c, ThreadPool& pool,
    const std::string& dump_dir = {});

}  // namespace qevict
