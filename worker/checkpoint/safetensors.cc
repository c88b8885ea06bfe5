#include "worker/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/process.h"

namespace shardtrain::checkpoint {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const char* DtypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kBFloat16:
      return "BF16";
    case DataType::kFloat16:
      return "F16";
    default:
      return "F32";
  }
}

// pread of exactly n bytes at `offset`, or an error.
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, size_t n, void* out) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(absl::StrCat(path, ": cannot read ", n, " bytes at ", offset, ": ",
                                              got < 0 ? std::strerror(errno) : "end of file"));
    }
    p += got;
    n -= size_t(got);
    offset += uint64_t(got);
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) {
    const std::string why = std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", why));
  }
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) {
    return absl::DataLossError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  const uint64_t size = uint64_t(st.st_size);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": not a valid safetensors file: ", why));
  };
  if (size < 8) return bad("shorter than the 8-byte header length");
  unsigned char length[8];
  if (absl::Status s = ReadAt(f->fd_, path, 0, 8, length); !s.ok()) return s;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > size - 8 || n > (uint64_t{100} << 20)) {
    return bad(absl::StrCat("header length ", n, " exceeds the file or 100 MiB"));
  }
  std::string text(n, '\0');
  if (absl::Status s = ReadAt(f->fd_, path, 8, n, text.data()); !s.ok()) return s;
  const Json header = Json::parse(text, nullptr, false);
  if (!header.is_object()) return bad("the header is not a JSON object");
  f->data_start_ = 8 + n;
  const uint64_t data_size = size - f->data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const Json& e = it.value();
    if (it.key() == "__metadata__") {
      if (!e.is_object()) return bad("__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (m.value().is_string()) f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      return bad(absl::StrCat("tensor ", it.key(), ": needs dtype, shape and data_offsets"));
    }
    SafetensorsEntry t;
    const std::string dtype = e["dtype"].get<std::string>();
    if (dtype == "F32") {
      t.dtype = DataType::kFloat32;
    } else if (dtype == "BF16") {
      t.dtype = DataType::kBFloat16;
    } else if (dtype == "F16") {
      t.dtype = DataType::kFloat16;
    } else {
      return absl::UnimplementedError(
          absl::StrCat(path, ": tensor ", it.key(), " is ", dtype, "; F32, BF16 and F16 are read"));
    }
    for (const Json& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return bad(absl::StrCat("tensor ", it.key(), ": bad shape"));
      }
      t.shape.push_back(d.get<int64_t>());
    }
    if (!e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned()) {
      return bad(absl::StrCat("tensor ", it.key(), ": bad data_offsets"));
    }
    t.begin = e["data_offsets"][0];
    t.end = e["data_offsets"][1];
    if (t.begin > t.end || t.end > data_size ||
        t.end - t.begin != uint64_t(t.numel()) * DataTypeSize(t.dtype)) {
      return bad(absl::StrCat("tensor ", it.key(), ": data_offsets [", t.begin, ", ", t.end,
                              ") do not hold shape ", ShapeText(t.shape), " of ", dtype, " within ",
                              data_size, " data bytes"));
    }
    f->tensors_.emplace(it.key(), std::move(t));
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SafetensorsFile::Read(const std::string& name, int64_t first, int64_t n,
                                   float* out) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, " has no tensor ", name));
  }
  const SafetensorsEntry& t = it->second;
  if (first < 0 || n < 0 || first + n > t.numel()) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": ", name, " elements [", first, ", ",
                                              first + n, ") outside its ", t.numel()));
  }
  const size_t eb = DataTypeSize(t.dtype);
  const uint64_t offset = data_start_ + t.begin + uint64_t(first) * eb;
  bytes_read_ += n * int64_t(eb);
  if (t.dtype == DataType::kFloat32) return ReadAt(fd_, path_, offset, size_t(n) * eb, out);
  // 16-bit: read in pieces and widen (never the whole tensor at once).
  constexpr int64_t kPiece = 1 << 20;
  std::vector<uint16_t> buf(size_t(std::min(n, kPiece)));
  for (int64_t done = 0; done < n;) {
    const int64_t k = std::min(n - done, kPiece);
    if (absl::Status s =
            ReadAt(fd_, path_, offset + uint64_t(done) * eb, size_t(k) * eb, buf.data());
        !s.ok()) {
      return s;
    }
    ToFloat32(t.dtype, buf.data(), out + done, size_t(k));
    done += k;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsSet>> SafetensorsSet::Open(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    const std::string single = path + "/model.safetensors";
    const std::string index = path + "/model.safetensors.index.json";
    if (fs::exists(single, ec)) {
      file = single;
    } else if (fs::exists(index, ec)) {
      file = index;
    } else {
      return absl::NotFoundError(
          absl::StrCat(path, " holds neither model.safetensors nor model.safetensors.index.json"));
    }
  }
  auto set = std::make_unique<SafetensorsSet>();
  set->dir_ = fs::path(file).parent_path().string();
  if (set->dir_.empty()) set->dir_ = ".";
  const bool is_index = file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(file);
    if (!f.ok()) return f.status();
    for (const auto& [name, e] : (*f)->tensors()) set->where_[name] = f->get();
    set->files_.push_back(*std::move(f));
    return set;
  }
  std::string text;
  if (absl::Status s = ReadFile(file, &text); !s.ok()) return s;
  const Json index = Json::parse(text, nullptr, false);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(absl::StrCat(file, ": not a safetensors index (no weight_map)"));
  }
  std::map<std::string, const SafetensorsFile*> opened;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return absl::DataLossError(absl::StrCat(file, ": weight_map[", it.key(), "] is no file"));
    }
    const std::string shard = it.value().get<std::string>();
    if (shard.find('/') != std::string::npos || shard == ".." || shard.empty()) {
      return absl::DataLossError(absl::StrCat(file, ": weight_map[", it.key(), "] names ", shard,
                                              ", not a file beside it"));
    }
    auto o = opened.find(shard);
    if (o == opened.end()) {
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
          SafetensorsFile::Open(set->dir_ + "/" + shard);
      if (!f.ok()) return f.status();
      o = opened.emplace(shard, f->get()).first;
      set->files_.push_back(*std::move(f));
    }
    if (o->second->tensors().count(it.key()) == 0) {
      return absl::DataLossError(absl::StrCat(file, ": ", it.key(), " is not in ", shard));
    }
    set->where_[it.key()] = o->second;
  }
  return set;
}

const SafetensorsEntry* SafetensorsSet::Find(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : &it->second->tensors().at(name);
}

std::vector<std::string> SafetensorsSet::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : where_) names.push_back(name);
  return names;
}

int64_t SafetensorsFile::data_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : tensors_) bytes += t.numel() * int64_t(DataTypeSize(t.dtype));
  return bytes;
}

ReadStats SafetensorsSet::Stats() const {
  ReadStats r;
  for (const auto& f : files_) {
    r.bytes_read += f->bytes_read();
    r.data_bytes += f->data_bytes();
    r.files_read += f->bytes_read() > 0 ? 1 : 0;
    ++r.files;
  }
  return r;
}

absl::Status SafetensorsSet::Read(const std::string& name, int64_t first, int64_t n,
                                  float* out) const {
  const auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat("the checkpoint in ", dir_, " has no tensor ", name));
  }
  return it->second->Read(name, first, n, out);
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<TensorToWrite>& tensors, DataType dtype,
                                  const std::map<std::string, std::string>& metadata) {
  if (dtype == DataType::kFloat16) {
    return absl::InvalidArgumentError("safetensors are written in fp32 or bf16");
  }
  Json header = Json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (numel != int64_t(t.data.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(t.name, ": ", t.data.size(), " values for shape ", ShapeText(t.shape)));
    }
    const uint64_t bytes = uint64_t(SafetensorsBytes(t, dtype));
    header[t.name] = {{"dtype", DtypeName(dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  char length[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) length[i] = char((n >> (8 * i)) & 0xff);  // little-endian
  std::vector<std::string_view> pieces = {std::string_view(length, 8), text};
  std::vector<std::vector<uint16_t>> narrowed;  // bf16 copies, alive until written
  narrowed.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    if (dtype == DataType::kFloat32) {
      pieces.emplace_back(reinterpret_cast<const char*>(t.data.data()),
                          t.data.size() * sizeof(float));
      continue;
    }
    std::vector<uint16_t>& h = narrowed.emplace_back(t.data.size());
    FromFloat32(dtype, t.data.data(), h.data(), t.data.size());
    pieces.emplace_back(reinterpret_cast<const char*>(h.data()), h.size() * sizeof(uint16_t));
  }
  return WriteFileAtomically(path, pieces);
}

}  // namespace shardtrain::checkpoint
