// CudaModel under LoRA (cuda_model.h): the frozen model in device memory —
// its tensors in the compute type, or its linear layers quantized in int8 /
// NF4 (model::FrozenFormat, quantized on the host by worker/quant, then
// copied) — the matmuls on a quantized weight a tile of dequantized rows at
// a time, and the adapters' GEMMs (kernels.h LoraForward / LoraBackward).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/model/weight_quant.h"
#include "worker/engine/cuda/cuda_model.h"
#include "worker/engine/cuda/cuda_model_internal.h"
#include "worker/optim/quant8.h"
#include "worker/quant/weight_quant.h"

namespace shardtrain::engine::cuda {
namespace {

// Offsets of a quantized tensor's arrays in the frozen byte buffer, each
// aligned to 256 bytes.
constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

absl::Status CudaModel::InitFrozen(const model::FrozenFormat& requested) {
  frozen_format_ = requested;
  frozen_format_.compute_bytes = static_cast<int>(DataTypeSize(compute()));
  const model::ParamLayout& base = frozen_layout();
  const std::vector<model::TensorInfo>& tensors = base.tensors();
  frozen_.assign(tensors.size(), FrozenTensor{});
  int64_t dense = 0, widest = 0;
  size_t bytes = 0, sink = 1;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const model::TensorInfo& t = tensors[i];
    FrozenTensor& f = frozen_[i];
    if (t.shape.size() == 1) sink = std::max(sink, t.numel);
    if (!model::QuantizedFrozenTensor(base, i, frozen_format_.quant)) {
      f.dense = dense;
      dense += static_cast<int64_t>(t.numel);
      continue;
    }
    // Where each array will live (pointers are set once the buffer is).
    const int64_t n = static_cast<int64_t>(t.numel), blocks = model::Nf4Blocks(n);
    f.quant.int8 = frozen_format_.quant == model::FrozenQuant::kInt8;
    f.quant.rows = t.shape[0];
    f.quant.cols = t.shape[1];
    widest = std::max(widest, t.shape[1]);
    f.codes_at = bytes;
    bytes += AlignUp(f.quant.int8 ? size_t(n) : size_t(n + 1) / 2);
    f.absmax_at = bytes;
    if (f.quant.int8 || !frozen_format_.double_quant) {
      bytes += AlignUp(sizeof(float) * size_t(f.quant.int8 ? t.shape[0] : blocks));
    } else {
      bytes += AlignUp(size_t(blocks));
      f.scale_at = bytes;
      bytes += AlignUp(sizeof(float) * size_t((blocks + model::kNf4AbsmaxBlockSize - 1) /
                                              model::kNf4AbsmaxBlockSize));
    }
  }
  auto alloc = [&](size_t count, DataType dt, std::unique_ptr<Buffer>* out) -> absl::Status {
    if (count == 0) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<Buffer>> b = device_->Allocate(count, dt);
    if (!b.ok()) return b.status();
    *out = *std::move(b);
    return absl::OkStatus();
  };
  absl::Status s = alloc(size_t(dense), compute(), &frozen_dense_);
  if (s.ok()) s = alloc(sink, DataType::kFloat32, &frozen_sink_);
  if (s.ok()) s = alloc((bytes + 3) / 4, DataType::kFloat32, &frozen_quant_);
  if (s.ok()) {
    s = alloc(size_t(model::kDequantTileRows) * size_t(widest), compute(), &frozen_tile_);
  }
  const bool double_quant =
      frozen_format_.quant == model::FrozenQuant::kNf4 && frozen_format_.double_quant;
  if (s.ok() && double_quant) s = alloc(256, DataType::kFloat32, &dynamic_map_);
  if (!s.ok()) return s;
  if (double_quant) {
    const optim::Quant8Map& map = optim::SignedDynamicMap();
    CheckCuda(
        cudaMemcpy(dynamic_map_->data(), map.data(), sizeof(float) * 256, cudaMemcpyHostToDevice),
        "cudaMemcpy (dynamic map)");
  }
  char* q = frozen_quant_ != nullptr ? frozen_quant_->as<char>() : nullptr;
  for (FrozenTensor& f : frozen_) {
    if (f.dense >= 0) continue;
    f.quant.codes = reinterpret_cast<const uint8_t*>(q + f.codes_at);
    if (f.scale_at < 0) {
      f.quant.absmax = reinterpret_cast<const float*>(q + f.absmax_at);
    } else {
      f.quant.absmax_codes = reinterpret_cast<const uint8_t*>(q + f.absmax_at);
      f.quant.absmax_scale = reinterpret_cast<const float*>(q + f.scale_at);
      f.quant.dynamic_map = dynamic_map_->as<float>();
    }
  }
  // Starts as the zero model: zero codes and scales dequantize to zeros.
  for (const auto* b : {&frozen_dense_, &frozen_quant_}) {
    if (*b != nullptr) {
      CheckCuda(cudaMemset((*b)->data(), 0, (*b)->bytes()), "cudaMemset (frozen model)");
    }
  }
  frozen_index_.assign(layout().tensors().size(), -1);
  for (int i = 0; i < static_cast<int>(layout().tensors().size()); ++i) {
    const model::TensorInfo& t = layout().tensors()[i];
    if (t.frozen) frozen_index_[i] = *base.FindTensor(t.name);
  }
  return absl::OkStatus();
}

int64_t CudaModel::frozen_bytes() const {
  int64_t total = 0;
  for (const auto* b : {&frozen_dense_, &frozen_quant_, &frozen_tile_, &dynamic_map_}) {
    if (*b != nullptr) total += int64_t((*b)->bytes());
  }
  return total;
}

void CudaModel::SetFrozen(const float* host) {
  const model::ParamLayout& base = frozen_layout();
  std::vector<float> dense(frozen_dense_ != nullptr ? frozen_dense_->count() : 0);
  char* q = frozen_quant_ != nullptr ? frozen_quant_->as<char>() : nullptr;
  auto put = [&](size_t at, const void* src, size_t n) {
    CheckCuda(cudaMemcpy(q + at, src, n, cudaMemcpyHostToDevice), "cudaMemcpy (frozen weight)");
  };
  for (int i = 0; i < static_cast<int>(frozen_.size()); ++i) {
    const model::TensorInfo& t = base.tensors()[i];
    FrozenTensor& f = frozen_[i];
    if (f.dense >= 0) {
      std::copy(host + t.offset, host + t.offset + t.numel, dense.begin() + f.dense);
      continue;
    }
    const quant::QuantizedWeight w =
        quant::QuantizeFrozen(frozen_format_, host + t.offset, t.shape[0], t.shape[1], &pool_);
    put(f.codes_at, w.codes.data(), w.codes.size());
    if (!w.absmax.empty()) put(f.absmax_at, w.absmax.data(), sizeof(float) * w.absmax.size());
    if (!w.absmax_codes.empty()) {
      put(f.absmax_at, w.absmax_codes.data(), w.absmax_codes.size());
      put(f.scale_at, w.absmax_scale.data(), sizeof(float) * w.absmax_scale.size());
    }
    f.quant.absmax_offset = w.absmax_offset;
  }
  if (!dense.empty()) DeviceFromFloats(frozen_dense_->data(), dense);
}

void CudaModel::GetFrozen(float* host) {
  const model::ParamLayout& base = frozen_layout();
  const std::vector<float> dense =
      frozen_dense_ != nullptr ? HostFloats(frozen_dense_->data(), int64_t(frozen_dense_->count()))
                               : std::vector<float>{};
  const char* q = frozen_quant_ != nullptr ? frozen_quant_->as<char>() : nullptr;
  auto get = [&](std::vector<uint8_t>* out, size_t at, size_t n) {
    out->resize(n);
    CheckCuda(cudaMemcpy(out->data(), q + at, n, cudaMemcpyDeviceToHost),
              "cudaMemcpy (frozen weight)");
  };
  for (int i = 0; i < static_cast<int>(frozen_.size()); ++i) {
    const model::TensorInfo& t = base.tensors()[i];
    const FrozenTensor& f = frozen_[i];
    if (f.dense >= 0) {
      std::copy(dense.begin() + f.dense, dense.begin() + f.dense + int64_t(t.numel),
                host + t.offset);
      continue;
    }
    const DeviceQuantWeight& d = f.quant;
    const int64_t n = d.rows * d.cols, blocks = model::Nf4Blocks(n);
    std::vector<uint8_t> codes, absmax, absmax_codes, scale;
    get(&codes, f.codes_at, d.int8 ? size_t(n) : size_t(n + 1) / 2);
    quant::QuantWeightView v;
    v.format = d.int8 ? quant::WeightFormat::kInt8 : quant::WeightFormat::kNf4;
    v.rows = d.rows;
    v.cols = d.cols;
    v.codes = codes.data();
    if (d.absmax != nullptr) {
      get(&absmax, f.absmax_at, sizeof(float) * size_t(d.int8 ? d.rows : blocks));
      v.absmax = reinterpret_cast<const float*>(absmax.data());
    } else {
      get(&absmax_codes, f.absmax_at, size_t(blocks));
      get(&scale, f.scale_at,
          sizeof(float) *
              size_t((blocks + model::kNf4AbsmaxBlockSize - 1) / model::kNf4AbsmaxBlockSize));
      v.absmax_codes = absmax_codes.data();
      v.absmax_scale = reinterpret_cast<const float*>(scale.data());
      v.absmax_offset = d.absmax_offset;
    }
    quant::DequantizeRows(v, 0, d.rows, host + t.offset);
  }
}

const DeviceQuantWeight* CudaModel::quantized(int tensor) const {
  if (tensor < 0 || !layout().tensors()[tensor].frozen) return nullptr;
  const FrozenTensor& f = frozen_[frozen_index_[tensor]];
  return f.dense >= 0 ? nullptr : &f.quant;
}

const void* CudaModel::frozen_param(int tensor) const {
  const FrozenTensor& f = frozen_[frozen_index_[tensor]];
  if (f.dense < 0) return nullptr;  // quantized: read through quantized()
  return frozen_dense_->as<char>() + f.dense * int64_t(DataTypeSize(compute()));
}

float* CudaModel::norm_grad(int tensor) const {
  if (tensor >= 0 && layout().tensors()[tensor].frozen) return frozen_sink_->as<float>();
  return grad(tensor);
}

void CudaModel::QuantMatmulForward(void* out, const void* inp, const DeviceQuantWeight& w, int bias,
                                   int N, int ld_out) {
  const size_t es = DataTypeSize(compute());
  const char* b = static_cast<const char*>(param(bias));
  for (int64_t r0 = 0; r0 < w.rows; r0 += model::kDequantTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(model::kDequantTileRows, w.rows - r0));
    Check(cuda::DequantizeRows(k(), frozen_tile_->data(), w, r0, rows));
    Check(cuda::MatmulForward(k(), static_cast<char*>(out) + r0 * es, inp, frozen_tile_->data(),
                              b == nullptr ? nullptr : b + r0 * es, N, static_cast<int>(w.cols),
                              rows, ld_out));
  }
}

void CudaModel::QuantMatmulBackward(void* dinp, const void* dout, int ld_dout,
                                    const DeviceQuantWeight& w, int N, bool overwrite) {
  const size_t es = DataTypeSize(compute());
  for (int64_t r0 = 0; r0 < w.rows; r0 += model::kDequantTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(model::kDequantTileRows, w.rows - r0));
    Check(cuda::DequantizeRows(k(), frozen_tile_->data(), w, r0, rows));
    // dinp (+)= dout[:, r0:r0+rows] · tile; the frozen weight has no gradient.
    Check(cuda::MatmulBackward(k(), dinp, nullptr, nullptr,
                               static_cast<const char*>(dout) + r0 * es, ld_dout, nullptr,
                               frozen_tile_->data(), N, static_cast<int>(w.cols), rows,
                               /*overwrite_dinp=*/overwrite && r0 == 0));
  }
}

void CudaModel::LoraForward(void* out, int ld, const void* in, int A, int B, int N, int in_dim,
                            int out_dim) {
  Check(cuda::LoraForward(k(), out, ld, lora_xa(), in, param(A), param(B),
                          static_cast<float>(config().lora.scale()), N, in_dim, out_dim,
                          config().lora.rank));
}

void CudaModel::LoraBackward(void* dinp, const void* dout, int ld, const void* in, int A, int B,
                             int N, int in_dim, int out_dim) {
  Check(cuda::LoraBackward(k(), dinp, grad(A), grad(B), lora_g(), lora_xa(), dout, ld, in, param(A),
                           param(B), static_cast<float>(config().lora.scale()), N, in_dim, out_dim,
                           config().lora.rank));
}

}  // namespace shardtrain::engine::cuda
