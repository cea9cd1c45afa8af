// .npy reader/writer (format: numpy.lib.format, version 1.0).
#include "core/npy.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace qevict {

namespace {
constexpr size_t kHeaderLen = 128;  // fixed header size: room for any shape we write

std::string make_header(int64_t rows, int64_t cols) {
  std::string dict =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  std::string h = "\x93NUMPY";
  h += '\x01';
  h += '\x00';
  const size_t total = kHeaderLen;
  const size_t dict_len = total - 10;
  dict.resize(dict_len - 1, ' ');
  dict += '\n';
  h += static_cast<char>(dict_len & 0xff);
  h += static_cast<char>((dict_len >> 8) & 0xff);
  return h + dict;
}
}  // namespace

Status NpyWriter::open(const std::string& path, int64_t n_cols) {
  QEVICT_RETURN_IF_ERROR(file_.open(path));
  path_ = path;
  cols_ = n_cols;
  rows_ = 0;
  return file_.write(make_header(0, n_cols));
}

Status NpyWriter::append_rows(const float* data, int64_t n_rows) {
  std::FILE* f = file_.file();
  if (!f) return Status::error("npy writer is not open");
  const size_t n = size_t(n_rows * cols_);
  if (std::fwrite(data, sizeof(float), n, f) != n)
    return Status::error(fmt::format("{}: write failed (disk full?)", path_));
  rows_ += n_rows;
  return Status::ok();
}

Status NpyWriter::close() {
  std::FILE* f = file_.file();
  if (!f) return Status::ok();
  const std::string h = make_header(rows_, cols_);
  if (std::fseek(f, 0, SEEK_SET) != 0 || std::fwrite(h.data(), 1, h.size(), f) != h.size()) {
    file_.discard();
    return Status::error(fmt::format("{}: could not finish the file", path_));
  }
  return file_.commit();
}

Status write_npy(const std::string& path, const float* data, int64_t n_rows, int64_t n_cols) {
  NpyWriter w;
  QEVICT_RETURN_IF_ERROR(w.open(path, n_cols));
  QEVICT_RETURN_IF_ERROR(w.append_rows(data, n_rows));
  return w.close();
}

Expected<NpyArray> read_npy(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  auto fail = [&](const std::string& why) {
    std::fclose(f);
    return Status::error(fmt::format("{}: {}", path, why));
  };
  unsigned char pre[10];
  if (std::fread(pre, 1, 10, f) != 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    return fail("not a .npy file");
  size_t hlen;
  if (pre[6] == 1) {
    hlen = pre[8] | (size_t(pre[9]) << 8);
  } else {
    unsigned char more[2];
    if (std::fread(more, 1, 2, f) != 2) return fail("truncated header");
    hlen = pre[8] | (size_t(pre[9]) << 8) | (size_t(more[0]) << 16) | (size_t(more[1]) << 24);
  }
  if (hlen > (1 << 20)) return fail("header too large");
  std::string h(hlen, '\0');
  if (std::fread(h.data(), 1, hlen, f) != hlen) return fail("truncated header");
  if (h.find("'<f4'") == std::string::npos)
    return fail("only little-endian float32 ('<f4') arrays are supported");
  if (h.find("'fortran_order': False") == std::string::npos)
    return fail("only C-order arrays are supported");
  const size_t sp = h.find("'shape': (");
  if (sp == std::string::npos) return fail("header has no shape");
  NpyArray a;
  long long r = 0, c = 1;
  const char* s = h.c_str() + sp + 10;
  char* end = nullptr;
  r = std::strtoll(s, &end, 10);
  if (end == s || r < 0) return fail("bad shape");
  while (*end == ' ' || *end == ',') ++end;
  if (*end != ')') {
    const char* s2 = end;
    c = std::strtoll(s2, &end, 10);
    if (end == s2 || c < 0) return fail("bad shape");
    while (*end == ' ' || *end == ',') ++end;
    if (*end != ')') return fail("only 1-D and 2-D arrays are supported");
  }
  a.rows = r;
  a.cols = c;
  a.data.resize(size_t(r * c));
  if (std::fread(a.data.data(), sizeof(float), a.data.size(), f) != a.data.size())
    return fail("truncated data");
  std::fclose(f);
  return a;
}

}  // namespace qevict
