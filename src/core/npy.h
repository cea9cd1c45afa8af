// Minimal .npy (NumPy format 1.0) for float32 C-order 2-D arrays: a streaming writer (rows
// appended as they are computed; the header is patched at close) and a reader that
// memory-maps nothing and checks the header strictly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/status.h"

namespace qevict {

class NpyWriter {
 public:
  NpyWriter() = default;
  ~NpyWriter() = default;
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // Starts a float32 array with `n_cols` columns and rows appended later. The rows go to a
  // temporary file beside `path` (AtomicFile): `path` appears only at a successful close().
  Status open(const std::string& path, int64_t n_cols);
  Status append_rows(const float* data, int64_t n_rows);
  // Writes the final shape into the header and renames the file into place.
  Status close();
  // Drops the file (the destructor does this when close() was not called: an error path).
  void discard() { file_.discard(); }
  int64_t rows() const { return rows_; }

 private:
  AtomicFile file_;
  std::string path_;
  int64_t cols_ = 0;
  int64_t rows_ = 0;
};

struct NpyArray {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;  // [rows][cols]
};

// Writes data [n_rows][n_cols] as one float32 array in one go (NpyWriter: the file appears
// only when complete).
Status write_npy(const std::string& path, const float* data, int64_t n_rows, int64_t n_cols);

// Reads a float32 (little-endian '<f4') C-order 1-D or 2-D .npy file.
Expected<NpyArray> read_npy(const std::string& path);

}  // namespace qevict
