// Flash attention (flash_attention.cu) against the CPU's attention on the
// same rounded inputs: out, the rows' logsumexp (the CPU's by-block
// forward over the whole sequence gives it), dqkv added to what was there;
// bits equal over two backward runs; grouped-query and multi-head heads,
// T not a multiple of the 64-row tiles, head sizes 64 and 128, bf16 and
// fp16. The support rule is checked without a device.
#include <cstdio>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

void Compare(const std::vector<float>& got, const std::vector<float>& want, double tol,
             const std::string& what) {
  CompareAndPrint("flash", got, want, tol, what);
}

TEST(FlashAttentionRuleTest, Bf16AndFp16WithHeadsOf64Or128) {
  EXPECT_TRUE(FlashAttentionSupports(DataType::kBFloat16, 768, 12, 12));   // GPT-2 124M
  EXPECT_TRUE(FlashAttentionSupports(DataType::kFloat16, 2048, 32, 8));    // Llama 3.2 1B
  EXPECT_TRUE(FlashAttentionSupports(DataType::kBFloat16, 4096, 32, 8));   // Llama 3 8B
  EXPECT_FALSE(FlashAttentionSupports(DataType::kFloat32, 768, 12, 12));   // would need TF32
  EXPECT_FALSE(FlashAttentionSupports(DataType::kBFloat16, 128, 4, 4));    // hs 32
  EXPECT_FALSE(FlashAttentionSupports(DataType::kBFloat16, 768, 12, 5));   // KVH must divide NH
  EXPECT_FALSE(FlashAttentionSupports(DataType::kBFloat16, 770, 12, 12));  // NH must divide C
}

TEST_F(CudaKernelsTest, FlashAttentionMatchesCpu) {
  struct Case {
    DataType dtype;
    int B, T, NH, KVH, hs;
  };
  for (const Case& c :
       {Case{DataType::kBFloat16, 2, 100, 4, 2, 64}, Case{DataType::kFloat16, 1, 64, 2, 2, 64},
        Case{DataType::kBFloat16, 1, 130, 2, 1, 128}, Case{DataType::kBFloat16, 2, 1, 2, 2, 64},
        // Several tiles on each side of the diagonal, a partial last one.
        Case{DataType::kFloat16, 1, 257, 4, 1, 64}, Case{DataType::kBFloat16, 1, 200, 2, 2, 128}}) {
    const DataType dtype = c.dtype;
    const int B = c.B, T = c.T, NH = c.NH, KVH = c.KVH, C = NH * c.hs, KV = KVH * c.hs;
    const int W = C + 2 * KV;
    const std::string label = absl::StrCat(DataTypeName(dtype), " B=", B, " T=", T, " NH=", NH,
                                           " KVH=", KVH, " hs=", c.hs, " ");
    SCOPED_TRACE(label);
    const size_t nqkv = size_t(B) * T * W, nout = size_t(B) * T * C, rows = size_t(B) * NH * T;
    // Scores of a few units, as trained models have: softmax neither flat
    // nor one-hot.
    const std::vector<float> qkv = Rounded(dtype, Uniform(rng_, nqkv, -1.5f, 1.5f));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, nout));
    const std::vector<float> dqkv0 = Rounded(dtype, Uniform(rng_, nqkv));

    // The CPU: out and att, lse by the block forward over the whole
    // sequence, dqkv += from att.
    std::vector<float> out(nout), att(rows * T), scratch(rows * T);
    cpu::AttentionForward<float>(out.data(), att.data(), qkv.data(), B, T, C, NH, KVH, nullptr);
    std::vector<int> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<float> kv(size_t(B) * T * 2 * KV), bout(nout), lse(rows), blk_out(nout),
        blk_lse(rows);
    cpu::CopyKv<float>(kv.data(), qkv.data(), B, T, C, KV, nullptr);
    cpu::AttentionBlockForward<float>(bout.data(), lse.data(), blk_out.data(), blk_lse.data(),
                                      qkv.data(), kv.data(), pos.data(), pos.data(), B, T, T, C, NH,
                                      KVH, true, scratch.data(), nullptr);
    // The backward's input out is the forward's, as stored (rounded).
    const std::vector<float> out_r = Rounded(dtype, out);
    std::vector<float> dqkv = dqkv0;
    cpu::AttentionBackward<float>(dqkv.data(), dout.data(), qkv.data(), att.data(), scratch.data(),
                                  B, T, C, NH, KVH, nullptr);

    const KernelCtx& k = Ctx(dtype);
    const size_t e = DataTypeSize(dtype);
    DevicePtr d_qkv = Upload(dtype, qkv), d_dout = Upload(dtype, dout);
    DevicePtr d_out = Alloc(nout * e), d_lse = Alloc(rows * 4), d_D = Alloc(rows * 4);
    ASSERT_OK(FlashAttentionForward(k, d_out.get(), static_cast<float*>(d_lse.get()), d_qkv.get(),
                                    B, T, C, NH, KVH));
    Compare(Download(dtype, d_out.get(), nout), out, kLowPrecisionTol, label + "out");
    Compare(DownloadF32(d_lse.get(), rows), lse, 1e-4, label + "lse");
    DevicePtr d_out_r = Upload(dtype, out_r);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      DevicePtr d_dqkv = Upload(dtype, dqkv0);
      ASSERT_OK(FlashAttentionBackward(k, d_dqkv.get(), static_cast<float*>(d_D.get()),
                                       d_dout.get(), d_qkv.get(), d_out_r.get(),
                                       static_cast<const float*>(d_lse.get()), B, T, C, NH, KVH));
      std::vector<float> got = Download(dtype, d_dqkv.get(), nqkv);
      if (run == 0) {
        Compare(got, dqkv, kLowPrecisionTol, label + "dqkv");
        first = std::move(got);
      } else {
        ExpectSameBits(got, first, label + "dqkv of a second backward");
      }
    }
  }
}

TEST_F(CudaKernelsTest, FlashAttentionRefusesWhatItDoesNotServe) {
  const KernelCtx& k = Ctx(kF32);
  EXPECT_EQ(FlashAttentionForward(k, nullptr, nullptr, nullptr, 1, 4, 128, 2, 2).code(),
            absl::StatusCode::kInvalidArgument);  // fp32
  const KernelCtx& h = Ctx(DataType::kBFloat16);
  EXPECT_EQ(FlashAttentionForward(h, nullptr, nullptr, nullptr, 1, 4, 128, 4, 4).code(),
            absl::StatusCode::kInvalidArgument);  // hs 32
}

}  // namespace
}  // namespace shardtrain::engine::cuda
