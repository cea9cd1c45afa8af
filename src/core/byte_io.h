// Little helpers for binary state (session files, engine/session_file.h): a writer that appends
// plain values and arrays to a string, and a reader that takes them back with every length
// checked against what is left, so that a truncated or corrupted input gives an error, never a
// read past the end or an allocation the input's size does not justify.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/status.h"

namespace qevict {

class ByteWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void put_bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  // A count (u64) then the elements.
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    put_bytes(v.data(), v.size() * sizeof(T));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    put_bytes(s.data(), s.size());
  }
  std::string& bytes() { return out_; }
  size_t size() const { return out_.size(); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  explicit ByteReader(const std::string& s)
      : p_(reinterpret_cast<const uint8_t*>(s.data())), n_(s.size()) {}

  size_t left() const { return n_ - at_; }
  size_t offset() const { return at_; }

  template <typename T>
  Status get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (left() < sizeof(T)) return short_read(sizeof(T));
    std::memcpy(v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::ok();
  }
  Status get_bytes(void* dst, size_t n) {
    if (left() < n) return short_read(n);
    if (n) std::memcpy(dst, p_ + at_, n);
    at_ += n;
    return Status::ok();
  }
  // A vector written by put_vec; `max` bounds the count (besides the bytes left).
  template <typename T>
  Status get_vec(std::vector<T>* v, uint64_t max = UINT64_MAX) {
    static_assert(std::is_trivially_copyable_v<T>);
    uint64_t n = 0;
    QEVICT_RETURN_IF_ERROR(get(&n));
    if (n > max) return Status::error("session state: an array longer than its bound");
    if (n > left() / (sizeof(T) ? sizeof(T) : 1)) return short_read(n * sizeof(T));
    v->resize(size_t(n));
    return get_bytes(v->data(), size_t(n) * sizeof(T));
  }
  Status get_str(std::string* s, uint64_t max = 1 << 20) {
    uint64_t n = 0;
    QEVICT_RETURN_IF_ERROR(get(&n));
    if (n > max || n > left()) return short_read(n);
    s->assign(reinterpret_cast<const char*>(p_ + at_), size_t(n));
    at_ += size_t(n);
    return Status::ok();
  }

 private:
  Status short_read(uint64_t want) const {
    return Status::error("session state is truncated: " + std::to_string(want) +
                         " bytes wanted at offset " + std::to_string(at_) + ", " +
                         std::to_string(left()) + " left");
  }
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

}  // namespace qevict
