#include "worker/engine/device.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace shardtrain::engine {

absl::Span<float> FlatView::f32() const {
  if (dtype != DataType::kFloat32 || device != DeviceKind::kCpu) {
    std::fprintf(stderr, "FlatView::f32: a %s buffer on %s is not host fp32\n",
                 std::string(DataTypeName(dtype)).c_str(), std::string(EnumName(device)).c_str());
    std::abort();
  }
  return absl::MakeSpan(static_cast<float*>(data), count);
}

}  // namespace shardtrain::engine
