// The activation table in bytes: statistics in fp32 whatever the compute
// type, every other tensor in the compute type, each aligned to 16 bytes
// within its kind.
#include "common/model/activations.h"

#include <gtest/gtest.h>

namespace shardtrain::model {
namespace {

bool IsStat(const std::string& name) {
  for (const char* suffix : {"_mean", "_rstd"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      return true;
  }
  return name == "losses" || name == "lse";
}

TEST(ActivationTableTest, StatisticsStayFp32AndTheRestTakeTheComputeType) {
  const GptConfig cfg = *MakeGptConfig(/*layers=*/2, /*heads=*/2, /*dim=*/6, /*context=*/8,
                                       /*vocab=*/11);
  for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dt)));
    const ActivationTable t(cfg, /*B=*/3, /*T=*/5, {}, dt);
    EXPECT_EQ(t.compute(), dt);
    int64_t saved = 0, scratch = 0, stats = 0;
    for (const ActivationTensor& a : t.tensors()) {
      EXPECT_EQ(a.dtype, IsStat(a.name) ? DataType::kFloat32 : dt) << a.name;
      EXPECT_EQ(a.offset % 16, 0) << a.name;
      int64_t& end = a.kind == ActivationKind::kSaved ? saved : scratch;
      EXPECT_EQ(a.offset, end) << a.name;  // packed in order, each rounded up to 16 bytes
      end += (a.numel * int64_t(DataTypeSize(a.dtype)) + 15) / 16 * 16;
      if (IsStat(a.name)) ++stats;
    }
    EXPECT_EQ(stats, 2 * 2 * 2 + 4);  // ln1/ln2 mean+rstd per layer, lnf's two, losses, lse
    EXPECT_EQ(t.saved_bytes(), saved);
    EXPECT_EQ(t.scratch_bytes(), scratch);
    EXPECT_EQ(t.bytes(3), 3 * saved + scratch);
  }
  // 15 rows: an fp32 statistic is 60 bytes (64 aligned); a (15, 6) bf16
  // tensor 180 (192), in fp32 360 (368).
  const ActivationTable bf(cfg, 3, 5, {}, DataType::kBFloat16);
  EXPECT_EQ(bf.at("block.0.ln1_mean").bytes(), 60);
  EXPECT_EQ(bf.at("block.0.ln1").bytes(), 180);
  EXPECT_EQ(bf.at("block.0.ln1_mean").offset - bf.at("block.0.ln1").offset, 192);
  const ActivationTable f(cfg, 3, 5);
  EXPECT_EQ(f.at("block.0.ln1_mean").offset - f.at("block.0.ln1").offset, 368);
}

}  // namespace
}  // namespace shardtrain::model
