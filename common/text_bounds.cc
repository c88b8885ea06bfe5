#include "common/text_bounds.h"

namespace shardtrain {

std::string Truncate(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Back off continuation bytes (10xxxxxx) so no character is split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "...";
}

std::string SanitizeLine(std::string_view text, size_t max_bytes) {
  // One byte more than fits, so that Truncate sees the text is too long.
  std::string clean(text.substr(0, max_bytes + 1));
  for (char& c : clean) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) c = ' ';
  }
  return Truncate(clean, max_bytes);
}

}  // namespace shardtrain
