// AtomicFile and the .npy writer on it: the destination appears only at commit/close, an
// abandoned write leaves neither the destination nor a temporary file, and an earlier file
// survives a failed rewrite.
#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/npy.h"

namespace qevict {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("qevict_atomic_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t n_entries() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }
  static std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, AppearsOnlyAtCommit) {
  const std::string path = (dir_ / "out.json").string();
  AtomicFile f;
  ASSERT_TRUE(f.open(path));
  ASSERT_TRUE(f.write("{\"a\": 1}\n"));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(n_entries(), 1u);  // the temporary file only
  ASSERT_TRUE(f.commit());
  EXPECT_EQ(slurp(path), "{\"a\": 1}\n");
  EXPECT_EQ(n_entries(), 1u);
}

TEST_F(AtomicFileTest, AbandonedWriteLeavesNothingAndKeepsTheOldFile) {
  const std::string path = (dir_ / "out.md").string();
  ASSERT_TRUE(write_file_atomic(path, "old"));
  {
    AtomicFile f;
    ASSERT_TRUE(f.open(path));
    ASSERT_TRUE(f.write("new but unfinished"));
  }  // destroyed without commit: an error path
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(n_entries(), 1u);
}

TEST_F(AtomicFileTest, MissingDirectoryIsOneClearError) {
  const std::string path = (dir_ / "no" / "such" / "out.csv").string();
  const Status s = write_file_atomic(path, "x");
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cannot create"), std::string::npos) << s.message();
}

TEST_F(AtomicFileTest, NpyWriterWithoutCloseLeavesNoFile) {
  const std::string path = (dir_ / "logits.npy").string();
  const float row[3] = {1, 2, 3};
  {
    NpyWriter w;
    ASSERT_TRUE(w.open(path, 3));
    ASSERT_TRUE(w.append_rows(row, 1));
  }  // a run that failed before close()
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(n_entries(), 0u);
  NpyWriter w;
  ASSERT_TRUE(w.open(path, 3));
  ASSERT_TRUE(w.append_rows(row, 1));
  ASSERT_TRUE(w.append_rows(row, 1));
  ASSERT_TRUE(w.close());
  auto a = read_npy(path);
  ASSERT_TRUE(a) << a.error();
  EXPECT_EQ(a->rows, 2);
  EXPECT_EQ(a->cols, 3);
  EXPECT_EQ(a->data[5], 3.0f);
  EXPECT_EQ(n_entries(), 1u);
}

}  // namespace
}  // namespace qevict
