// Status and StatusOr: the error type of every fallible call in asyncps.
//
// A Status is either OK or carries a code and a message. The code tells the
// caller what to do next: kUnavailable and kTimedOut mean "retry later",
// kResourceExhausted means "back off", everything else is final for that
// request. Status is a small value type; copying an OK status allocates
// nothing. No exception crosses a module's API: adapters around cppzmq,
// Cap'n Proto, RocksDB and CUDA convert their errors into Status.
//
// Thread safety: distinct objects may be used from different threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace asyncps {

// Codes travel over the wire (see common/protocol.capnp): never renumber.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,     // Bad input: fix the request, do not retry.
  kNotFound = 2,            // Unknown tensor, chunk or key.
  kAlreadyExists = 3,       // Conflicting registration.
  kFailedPrecondition = 4,  // Not valid in the current state (e.g. stale push).
  kUnavailable = 5,         // Peer not reachable now: retry with backoff.
  kTimedOut = 6,            // Deadline passed: retry or give up.
  kResourceExhausted = 7,   // Limit hit (size, queue): back off.
  kCorruption = 8,          // Stored or received data is damaged.
  kInternal = 9,            // A bug or an unexpected library failure.
  kCancelled = 10,          // Shut down while waiting.
  kUnimplemented = 11,      // Not supported by this build or version.
  kPermissionDenied = 12,   // The sender may not make this request: do not
                            // retry (a replica request from a process that
                            // is not its group's primary, bad credentials).
};

// Returns a stable name such as "InvalidArgument".
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string_view message);

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string_view m) {
    return {StatusCode::kInvalidArgument, m};
  }
  static Status NotFound(std::string_view m) {
    return {StatusCode::kNotFound, m};
  }
  static Status AlreadyExists(std::string_view m) {
    return {StatusCode::kAlreadyExists, m};
  }
  static Status FailedPrecondition(std::string_view m) {
    return {StatusCode::kFailedPrecondition, m};
  }
  static Status Unavailable(std::string_view m) {
    return {StatusCode::kUnavailable, m};
  }
  static Status TimedOut(std::string_view m) {
    return {StatusCode::kTimedOut, m};
  }
  static Status ResourceExhausted(std::string_view m) {
    return {StatusCode::kResourceExhausted, m};
  }
  static Status Corruption(std::string_view m) {
    return {StatusCode::kCorruption, m};
  }
  static Status Internal(std::string_view m) {
    return {StatusCode::kInternal, m};
  }
  static Status Cancelled(std::string_view m) {
    return {StatusCode::kCancelled, m};
  }
  static Status Unimplemented(std::string_view m) {
    return {StatusCode::kUnimplemented, m};
  }
  static Status PermissionDenied(std::string_view m) {
    return {StatusCode::kPermissionDenied, m};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // True for codes where the same request may succeed later
  // (kUnavailable, kTimedOut, kResourceExhausted).
  bool IsRetryable() const;

  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy with "context: " prepended to the message.
  Status WithContext(std::string_view context) const;

  bool operator==(const Status& o) const {
    return code_ == o.code_ && message_ == o.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status)
      : status_(status) {  // NOLINT: implicit by design
    if (status_.ok())
      status_ = Status::Internal("StatusOr built from an OK status");
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok())
      status_ = Status::Internal("StatusOr built from an OK status");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<
                            std::is_convertible_v<U&&, T> &&
                            !std::is_same_v<std::decay_t<U>, Status>>>
  StatusOr(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace asyncps

#define ASYNCPS_CONCAT_INNER_(a, b) a##b
#define ASYNCPS_CONCAT_(a, b) ASYNCPS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` yields a non-OK Status.
#define RETURN_IF_ERROR(expr)       \
  do {                              \
    ::asyncps::Status _st = (expr); \
    if (!_st.ok()) return _st;      \
  } while (0)

// `lhs` = value of the StatusOr `expr`, or return its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(ASYNCPS_CONCAT_(_status_or_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
