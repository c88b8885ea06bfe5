#include "worker/data/tokens.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace shardtrain::data {
namespace fs = std::filesystem;

void TokenIds::Window(size_t start, int T, int* inputs, int* targets) const {
  auto copy = [&](const auto* w) {
    for (int t = 0; t < T; ++t) {
      inputs[t] = static_cast<int>(w[t]);
      targets[t] = static_cast<int>(w[t + 1]);
    }
  };
  if (is_wide_) {
    copy(wide_.data() + start);
  } else {
    copy(narrow_.data() + start);
  }
}

void TokenIds::Append(TokenIds other) {
  if (empty() && (other.is_wide_ || !is_wide_)) {
    *this = std::move(other);
    return;
  }
  if (other.is_wide_ && !is_wide_) {
    wide_.assign(narrow_.begin(), narrow_.end());
    narrow_ = {};
    is_wide_ = true;
  }
  if (!is_wide_) {
    narrow_.insert(narrow_.end(), other.narrow_.begin(), other.narrow_.end());
  } else if (other.is_wide_) {
    wide_.insert(wide_.end(), other.wide_.begin(), other.wide_.end());
  } else {
    wide_.insert(wide_.end(), other.narrow_.begin(), other.narrow_.end());
  }
}

bool operator==(const TokenIds& a, const TokenIds& b) {
  if (a.is_wide_ == b.is_wide_) return a.is_wide_ ? a.wide_ == b.wide_ : a.narrow_ == b.narrow_;
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

absl::StatusOr<TokenFormat> ParseTokenFormat(const std::string& name) {
  if (name == "text") return TokenFormat::kText;
  if (name == "llmc") return TokenFormat::kLlmc;
  return absl::InvalidArgumentError(
      absl::StrCat("data.format must be 'text' or 'llmc', got '", name, "'"));
}

namespace {

absl::Status ReadWholeFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open data file ", path, ": ", std::strerror(errno)));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  out->resize(static_cast<size_t>(std::max<std::streamoff>(size, 0)));
  if (size > 0 && !in.read(out->data(), size)) {
    return absl::DataLossError(absl::StrCat("error reading data file ", path));
  }
  return absl::OkStatus();
}

// The files `path` stands for: itself, or a directory's regular files named
// *`ext`, in sorted name order (NotFound naming the directory when none).
absl::StatusOr<std::vector<std::string>> DataFiles(const std::string& path, const char* ext) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("data path ", path, " does not exist"));
  }
  std::vector<std::string> files;
  if (!fs::is_directory(path, ec)) return std::vector<std::string>{path};
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ext) {
      files.push_back(entry.path().string());
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot list data directory ", path, ": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat("data directory ", path, " contains no ", ext, " files"));
  }
  return files;
}

// Appends the tokens of one llm.c token file to *tokens (errors as
// LoadLlmcTokens', without the length check).
absl::Status AppendLlmcFile(const std::string& path, int vocab, TokenIds* tokens);

}  // namespace

absl::StatusOr<TokenIds> LoadTextTokens(const std::string& path, int64_t min_tokens) {
  absl::StatusOr<std::vector<std::string>> files = DataFiles(path, ".txt");
  if (!files.ok()) return files.status();
  std::vector<uint16_t> tokens;
  std::string bytes;
  for (const std::string& f : *files) {
    if (auto s = ReadWholeFile(f, &bytes); !s.ok()) return s;
    tokens.reserve(tokens.size() + bytes.size());
    for (unsigned char c : bytes) tokens.push_back(c);
  }
  if (static_cast<int64_t>(tokens.size()) < min_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("data ", path, " is ", tokens.size() == 0 ? "empty" : "too short", ": ",
                     tokens.size(), " tokens, need at least ", min_tokens, " (seq_len + 1)"));
  }
  return TokenIds(std::move(tokens));
}

absl::StatusOr<TokenIds> LoadLlmcTokens(const std::string& path, int vocab, int64_t min_tokens) {
  absl::StatusOr<std::vector<std::string>> files = DataFiles(path, ".bin");
  if (!files.ok()) return files.status();
  TokenIds tokens;
  for (const std::string& f : *files) {
    if (absl::Status s = AppendLlmcFile(f, vocab, &tokens); !s.ok()) return s;
  }
  const int64_t count = static_cast<int64_t>(tokens.size());
  if (count < min_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", files->size() > 1 ? "files in " : "file ", path, " ",
                     files->size() > 1 ? "are" : "is", " ", count == 0 ? "empty" : "too short",
                     ": ", count, " tokens, need at least ", min_tokens, " (seq_len + 1)"));
  }
  return tokens;
}

namespace {

// Checks every id of `ids` (n of them) against vocab.
template <typename T>
absl::Status CheckIds(const std::string& path, const T* ids, int64_t n, int vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= static_cast<uint32_t>(vocab)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, ": token ", ids[i], " at index ", i, " is >= model.vocab ", vocab));
    }
  }
  return absl::OkStatus();
}

absl::Status AppendLlmcFile(const std::string& path, int vocab, TokenIds* out) {
  std::string bytes;
  if (auto s = ReadWholeFile(path, &bytes); !s.ok()) return s;
  constexpr size_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
  if (bytes.size() < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat("token file ", path, " is truncated: ", bytes.size(),
                                            " bytes, shorter than the ", kHeaderBytes,
                                            "-byte llm.c header"));
  }
  int32_t header[kLlmcHeaderInts];
  std::memcpy(header, bytes.data(), kHeaderBytes);
  if (header[0] != kLlmcMagic && header[0] != kLlmcWideMagic) {
    return absl::DataLossError(absl::StrCat("token file ", path, " has wrong magic ", header[0],
                                            " (expected ", kLlmcMagic, " or ", kLlmcWideMagic,
                                            ")"));
  }
  const bool wide = header[0] == kLlmcWideMagic;
  const int32_t want = wide ? kLlmcWideVersion : kLlmcVersion;
  if (header[1] != want) {
    return absl::DataLossError(absl::StrCat("token file ", path, " has unsupported version ",
                                            header[1], " (expected ", want, " with magic ",
                                            header[0], ")"));
  }
  const size_t width = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  const int64_t count = header[2];
  const int64_t present = static_cast<int64_t>((bytes.size() - kHeaderBytes) / width);
  if (count < 0 || count > present) {
    return absl::DataLossError(absl::StrCat("token file ", path, " is truncated: header says ",
                                            count, " tokens but the file holds ", present));
  }
  if (wide) {
    std::vector<uint32_t> ids(count);
    std::memcpy(ids.data(), bytes.data() + kHeaderBytes, count * width);
    if (absl::Status s = CheckIds(path, ids.data(), count, vocab); !s.ok()) return s;
    out->Append(TokenIds(std::move(ids)));
  } else {
    std::vector<uint16_t> ids(count);
    std::memcpy(ids.data(), bytes.data() + kHeaderBytes, count * width);
    if (absl::Status s = CheckIds(path, ids.data(), count, vocab); !s.ok()) return s;
    out->Append(TokenIds(std::move(ids)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenIds> LoadTokens(const std::string& path, TokenFormat format, int vocab,
                                    int64_t min_tokens) {
  if (format == TokenFormat::kLlmc) return LoadLlmcTokens(path, vocab, min_tokens);
  if (vocab < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("the byte tokenizer for ", path, " needs model.vocab >= 256, got ", vocab));
  }
  return LoadTextTokens(path, min_tokens);
}

absl::Status WriteLlmcTokens(const std::string& path, const TokenIds& tokens) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create token file ", path, ": ", std::strerror(errno)));
  }
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = tokens.wide() ? kLlmcWideMagic : kLlmcMagic;
  header[1] = tokens.wide() ? kLlmcWideVersion : kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
  if (!tokens.empty()) {
    ok = ok && (tokens.wide()
                    ? std::fwrite(tokens.wide_ids().data(), sizeof(uint32_t), tokens.size(), f)
                    : std::fwrite(tokens.narrow().data(), sizeof(uint16_t), tokens.size(), f)) ==
                   tokens.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return absl::DataLossError(absl::StrCat("error writing token file ", path));
  return absl::OkStatus();
}

std::vector<int> EncodeBytes(const std::string& text) {
  std::vector<int> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string DecodeBytes(const std::vector<int>& tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (int t : tokens) out.push_back(static_cast<char>(t & 0xFF));
  return out;
}

}  // namespace shardtrain::data
