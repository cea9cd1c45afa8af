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
#include "model/model.h"

namespace qevict {

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
