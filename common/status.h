// Errors as values. A Status is ok or carries a message a person can act on (it names the config path,
// the file or the rank and the reason). Expected<T> is a value or such an error. Libraries return these;
// only main() turns them into an exit code.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ms {

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.m_message = std::move(message);
    s.m_failed = true;
    return s;
  }
  bool isOk() const { return !m_failed; }
  explicit operator bool() const { return isOk(); }
  const std::string& message() const { return m_message; }
  // Prefixes the message with where it happened: "reading foo.bin: truncated".
  Status withContext(const std::string& context) const {
    if (isOk()) return *this;
    return error(context + ": " + m_message);
  }

 private:
  std::string m_message;
  bool m_failed = false;
};

template <typename T>
class Expected {
 public:
  Expected(T value) : m_value(std::move(value)) {}
  Expected(Status error) : m_error(std::move(error)) { assert(!m_error.isOk()); }
  bool isOk() const { return m_value.has_value(); }
  explicit operator bool() const { return isOk(); }
  T& value() {
    assert(isOk());
    return *m_value;
  }
  const T& value() const {
    assert(isOk());
    return *m_value;
  }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Status& status() const { return m_error; }
  const std::string& message() const { return m_error.message(); }

 private:
  std::optional<T> m_value;
  Status m_error;
};

}  // namespace ms

// Early return of a failed Status from a function returning Status or Expected<T>.
#define MS_TRY(expr)                                   \
  do {                                                 \
    ::ms::Status ms_try_status_ = (expr);              \
    if (!ms_try_status_.isOk()) return ms_try_status_; \
  } while (0)
