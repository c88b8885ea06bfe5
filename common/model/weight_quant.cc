#include "common/model/weight_quant.h"

#include <algorithm>
#include <string_view>

namespace shardtrain::model {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

bool QuantizedFrozenTensor(const ParamLayout& base, int i, FrozenQuant quant) {
  if (quant == FrozenQuant::kNone) return false;
  const TensorInfo& t = base.tensors()[i];
  if (t.shape.size() != 2 || t.name.rfind("block.", 0) != 0) return false;
  for (std::string_view linear :
       {".attn.qkv.weight", ".attn.proj.weight", ".mlp.fc.weight", ".mlp.proj.weight"}) {
    if (EndsWith(t.name, linear)) return true;
  }
  return false;
}

int64_t FrozenTensorBytes(const ParamLayout& base, int i, const FrozenFormat& format) {
  const TensorInfo& t = base.tensors()[i];
  const int64_t n = static_cast<int64_t>(t.numel);
  if (!QuantizedFrozenTensor(base, i, format.quant)) return n * format.compute_bytes;
  if (format.quant == FrozenQuant::kInt8) return Int8RowsBytes(t.shape[0], t.shape[1]);
  return Nf4Bytes(n, format.double_quant);
}

int64_t FrozenModelBytes(const ParamLayout& base, const FrozenFormat& format) {
  int64_t bytes = 0, widest = 0;
  for (int i = 0; i < static_cast<int>(base.tensors().size()); ++i) {
    bytes += FrozenTensorBytes(base, i, format);
    if (QuantizedFrozenTensor(base, i, format.quant)) {
      widest = std::max(widest, base.tensors()[i].shape[1]);
    }
  }
  return bytes + int64_t{kDequantTileRows} * widest * format.compute_bytes;
}

}  // namespace shardtrain::model
