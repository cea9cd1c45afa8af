// Minimal .npy (NumPy format 1.0) for float32 C-order 2-D arrays: a streaming writer (rows
// appended as they are computed; the header is patched at close) and a reader that
// memory-maps nothing and checks the header strictly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"

namespace qevict {

class NpyWriter {
 public:
  NpyWriter() = default;
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // Creates `path` for a float32 array with `n_cols` columns and rows appended later.
  Status open(const std::string& path, int64_t n_cols);
  Status append_rows(const float* data, int64_t n_rows);
  // Writes the final shape into the header and closes the file.
  Status close();
  int64_t rows() const { return rows_; }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  int64_t cols_ = 0;
  int64_t rows_ = 0;
};

struct NpyArray {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;  // [rows][cols]
};

// Reads a float32 (little-endian '<f4') C-order 1-D or 2-D .npy file.
Expected<NpyArray> read_npy(const std::string& path);

}  // namespace qevict
