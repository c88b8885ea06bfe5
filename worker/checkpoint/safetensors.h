// safetensors files (huggingface/safetensors, docs "Format"), read a tensor
// range at a time and written in fp32 or bf16: the container of Hugging Face
// weights (hf_gpt2.h, hf_llama.h).
//
// Format: an 8-byte little-endian header length N, N bytes of JSON header
//   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
//    ..., "__metadata__": {"key": "value", ...}}
// (padded with spaces to a multiple of 8), then the tensors' raw
// little-endian bytes, data_offsets relative to the end of the header. A
// checkpoint too large for one file is several files and
// model.safetensors.index.json, {"metadata": {...}, "weight_map": {"NAME":
// "FILE", ...}} (SafetensorsSet).
//
// Reading never holds more than the range asked for: a model that does not
// fit in memory twice loads tensor by tensor. F32, BF16 and F16 are read
// (converted to fp32); other dtypes are refused naming the tensor.
// Thread-compatible; a reader's Read may run on several threads at once
// (pread).
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_SAFETENSORS_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace shardtrain::checkpoint {

struct SafetensorsEntry {
  DataType dtype = DataType::kFloat32;  // F32, BF16 or F16
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data bytes, relative to the data's start
  int64_t numel() const;
};

// What reading a checkpoint took: tensor bytes read, of how many in all, and
// from how many of its files.
struct ReadStats {
  int64_t bytes_read = 0;
  int64_t data_bytes = 0;
  int files_read = 0;
  int files = 0;
};

// One safetensors file, open for reading.
class SafetensorsFile {
 public:
  // NOT_FOUND (missing); DATA_LOSS naming the file (and tensor) for a
  // malformed header or offsets outside the file or not matching the shape;
  // UNIMPLEMENTED naming a tensor of a dtype other than F32, BF16, F16.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Elements [first, first + n) of tensor `name` (row-major) as fp32.
  // NOT_FOUND for an unknown tensor; OUT_OF_RANGE past its end; DATA_LOSS
  // for a short read.
  absl::Status Read(const std::string& name, int64_t first, int64_t n, float* out) const;
  // Bytes of tensor data Read so far, and in the whole file.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t data_bytes() const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  mutable int64_t bytes_read_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint's tensors: one safetensors file, or the files an index names.
class SafetensorsSet {
 public:
  // `path`: a .safetensors file, a model.safetensors.index.json, or a
  // folder holding model.safetensors or model.safetensors.index.json.
  // NOT_FOUND naming what is missing; DATA_LOSS for a malformed index (or a
  // tensor the index places in a file that lacks it); SafetensorsFile's
  // errors for each file.
  static absl::StatusOr<std::unique_ptr<SafetensorsSet>> Open(const std::string& path);
  // The tensor `name`, or nullptr.
  const SafetensorsEntry* Find(const std::string& name) const;
  std::vector<std::string> Names() const;
  absl::Status Read(const std::string& name, int64_t first, int64_t n, float* out) const;
  // The folder the files are in (config.json lies beside them).
  const std::string& dir() const { return dir_; }
  // What the reads so far took.
  ReadStats Stats() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// A tensor to write: its name, shape and fp32 values (row-major).
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  absl::Span<const float> data;
};

// Writes `tensors` in this order as one safetensors file in `dtype` (fp32,
// or bf16 rounded to nearest even) with `metadata`, atomically
// (WriteFileAtomically). INVALID_ARGUMENT when a tensor's data does not
// match its shape, or for fp16.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<TensorToWrite>& tensors, DataType dtype,
                                  const std::map<std::string, std::string>& metadata = {});

// The bytes one tensor takes in `dtype` (what shards are sized by).
inline int64_t SafetensorsBytes(const TensorToWrite& t, DataType dtype) {
  return int64_t(t.data.size()) * int64_t(DataTypeSize(dtype));
}

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_SAFETENSORS_H_
