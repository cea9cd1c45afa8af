// Errors as values at module boundaries: Status (ok or a message) and Expected<T>.
// Library code never calls exit() and never lets an exception escape.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace qevict {

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string msg) {
    Status s;
    s.failed_ = true;
    s.msg_ = std::move(msg);
    return s;
  }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return msg_; }

 private:
  bool failed_ = false;
  std::string msg_;
};

// Holds either a value or an error Status. Access value() only when has_value().
template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}   // NOLINT: implicit by design
  Expected(Status err) : v_(std::move(err)) {}  // NOLINT: must be an error status
  bool has_value() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return has_value(); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return has_value() ? Status::ok() : std::get<Status>(v_); }
  const std::string& error() const { return std::get<Status>(v_).message(); }

 private:
  std::variant<T, Status> v_;
};

#define QEVICT_RETURN_IF_ERROR(expr) \
  do {                               \
    ::qevict::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;    \
  } while (0)

}  // namespace qevict
