// Names of enum values from one table each, indexed by the enum's
// underlying value (0, 1, 2, ... in declaration order): what every
// "EnumName(v)" function returns, without a switch per enum.
#ifndef SHARDTRAIN_COMMON_ENUM_NAMES_H_
#define SHARDTRAIN_COMMON_ENUM_NAMES_H_

#include <cstddef>
#include <string_view>

namespace shardtrain {

// names[v], or `fallback` for a value outside the table. S is the table's
// string-view type (std:: or absl::, which differ in Debian's abseil).
template <typename S, typename E, size_t N>
constexpr S NameIn(const S (&names)[N], E v, S fallback = "?") {
  const auto i = static_cast<size_t>(v);
  return i < N ? names[i] : fallback;
}

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_ENUM_NAMES_H_
