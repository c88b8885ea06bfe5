// Bounds on text that comes from outside (requests, reports) before it is
// echoed in an error, stored in an event or listed: so that no input makes
// an answer or the state grow without limit. Pure functions.
#ifndef SHARDTRAIN_COMMON_TEXT_BOUNDS_H_
#define SHARDTRAIN_COMMON_TEXT_BOUNDS_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace shardtrain {

// The most bytes of input an error message echoes.
inline constexpr size_t kMaxEchoBytes = 256;
// The most bytes of one event's text (reports, reasons).
inline constexpr size_t kMaxEventBytes = 1024;

// `text` when it has at most `max_bytes` bytes; otherwise its first bytes,
// cut at a UTF-8 character boundary, followed by "..." (the result has at
// most max_bytes + 3 bytes).
std::string Truncate(std::string_view text, size_t max_bytes = kMaxEchoBytes);

// One line for an event log: control characters (0x00-0x1F and 0x7F, newlines
// included) are
// replaced by a space, then Truncate(max_bytes).
std::string SanitizeLine(std::string_view text, size_t max_bytes = kMaxEventBytes);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_TEXT_BOUNDS_H_
