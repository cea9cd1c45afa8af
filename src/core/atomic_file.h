// All-or-nothing output files: bytes go to a temporary file in the destination's directory,
// which is renamed over the destination only once everything is written and flushed. A run
// that fails, is killed or fills the disk leaves the previous file (or none), never half of one.
// Used for every output file the CLI writes (JSON, Markdown, CSV, .npy); eval's resumable
// results.jsonl is the exception (appended a line at a time, partial last lines tolerated).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "core/status.h"

namespace qevict {

class AtomicFile {
 public:
  AtomicFile() = default;
  ~AtomicFile();  // discards the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Creates "<path>.tmp-XXXXXX" beside `path` (the same file system, so rename is atomic).
  Status open(const std::string& path);
  // The open temporary file, for callers that write or seek themselves (nullptr when closed).
  std::FILE* file() const { return f_; }
  Status write(std::string_view bytes);
  // Flushes, syncs and closes the temporary file, then renames it to the destination.
  Status commit();
  // Closes and removes the temporary file (also what the destructor does before commit()).
  void discard();
  const std::string& path() const { return path_; }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  std::string tmp_path_;
};

// Writes `contents` to `path` through an AtomicFile. Errors name the file.
Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace qevict
