// AtomicFile: temporary file + fsync + rename; see atomic_file.h.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace qevict {

AtomicFile::~AtomicFile() { discard(); }

Status AtomicFile::open(const std::string& path) {
  discard();
  path_ = path;
  // O_EXCL with mode 0666 (not mkstemp's 0600): the output gets the umask's usual permissions.
  static std::atomic<uint64_t> counter{0};
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp_path_ = fmt::format("{}.tmp-{}-{}", path, getpid(), counter++);
    fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int e = errno;
    tmp_path_.clear();
    return Status::error(fmt::format("{}: cannot create: {}", path, std::strerror(e)));
  }
  f_ = fdopen(fd, "wb");
  if (!f_) {
    const int e = errno;
    ::close(fd);
    std::remove(tmp_path_.c_str());
    tmp_path_.clear();
    return Status::error(fmt::format("{}: cannot create: {}", path, std::strerror(e)));
  }
  return Status::ok();
}

Status AtomicFile::write(std::string_view bytes) {
  if (!f_) return Status::error(fmt::format("{}: not open for writing", path_));
  if (std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size())
    return Status::error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
  return Status::ok();
}

Status AtomicFile::commit() {
  if (!f_) return Status::error(fmt::format("{}: not open for writing", path_));
  bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
  int e = ok ? 0 : errno;
  if (std::fclose(f_) != 0 && ok) {
    ok = false;
    e = errno;
  }
  f_ = nullptr;
  if (ok && std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    std::remove(tmp_path_.c_str());
    tmp_path_.clear();
    return Status::error(fmt::format("{}: cannot write: {}", path_, std::strerror(e)));
  }
  tmp_path_.clear();
  return Status::ok();
}

void AtomicFile::discard() {
  if (f_) {
    std::fclose(f_);
    f_ = nullptr;
  }
  if (!tmp_path_.empty()) {
    std::remove(tmp_path_.c_str());
    tmp_path_.clear();
  }
}

Status write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f;
  QEVICT_RETURN_IF_ERROR(f.open(path));
  QEVICT_RETURN_IF_ERROR(f.write(contents));
  return f.commit();
}

}  // namespace qevict
