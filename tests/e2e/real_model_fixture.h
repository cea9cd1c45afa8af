// The fixture of the end-to-end tests that run the real model on the committed golden
// tokens: loads $QEVICT_TEST_MODEL (skips when unset) and the token ids of
// tests/golden/model_golden.json.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "model/model.h"

namespace qevict {

// Sets the matmul paths that are not exact up to f32 summation order (the AMX prefill path
// and the 8-bit-activation decode path, kernels/matmul.h) for its lifetime, and restores
// them: for tests whose claim is that two computations agree to f32 rounding, which the
// 8-bit path's activation rounding (it flips on tiny input changes) would hide.
class MatmulPaths {
 public:
  MatmulPaths(bool amx, bool q8) : amx_(matmul_amx_enabled()), q8_(matmul_q8_enabled()) {
    matmul_set_amx(amx);
    matmul_set_q8(q8);
  }
  ~MatmulPaths() {
    matmul_set_amx(amx_);
    matmul_set_q8(q8_);
  }
  MatmulPaths(const MatmulPaths&) = delete;
  MatmulPaths& operator=(const MatmulPaths&) = delete;

 private:
  bool amx_, q8_;
};

class RealModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* p = std::getenv("QEVICT_TEST_MODEL");
    if (!p || !*p) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
    auto m = Model::load(p);
    ASSERT_TRUE(m.has_value()) << m.error();
    model_ = std::move(*m);
    std::ifstream in(QEVICT_TEST_DATA_DIR "/golden/model_golden.json");
    tokens_ = nlohmann::json::parse(in)["tokens"].get<std::vector<int32_t>>();
  }
  std::unique_ptr<Model> model_;
  std::vector<int32_t> tokens_;
  ThreadPool pool_{2};
};

}  // namespace qevict
