// The Mixture-of-Experts kernels (moe.cu) against the CPU's layers
// (engine/cpu/moe_layers.h) in fp32 (1e-5) and bf16 / fp16 (2e-2): the
// router's scores, choice and gates from its logits (the CPU's router run
// with an identity weight, so that its logits are the input) and their
// backward, the permutation of rows into expert blocks and its backward, the
// combine and its backward. Both scorings; an expert no token chose.
#include <vector>

#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cpu/moe_layers.h"

namespace shardtrain::engine::cuda {
namespace {

TEST_F(CudaKernelsTest, MoeKernelsMatchCpu) {
  constexpr int N = 37, E = 6, K = 2, C = 40;
  for (const bool sigmoid : {false, true}) {
    for (DataType dtype : {kF32, DataType::kBFloat16, DataType::kFloat16}) {
      SCOPED_TRACE(std::string(DataTypeName(dtype)) + (sigmoid ? " sigmoid" : " softmax"));
      const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
      const model::RouterScoring scoring =
          sigmoid ? model::RouterScoring::kSigmoid : model::RouterScoring::kSoftmax;
      const bool norm = !sigmoid;
      // Logits that never choose expert E-1.
      std::vector<float> logits = Uniform(rng_, size_t(N) * E, -2.0f, 2.0f);
      for (int t = 0; t < N; ++t) logits[size_t(t) * E + E - 1] = -8.0f;
      logits = Rounded(dtype, logits);
      std::vector<float> eye(size_t(E) * E, 0.0f);
      for (int e = 0; e < E; ++e) eye[size_t(e) * E + e] = 1.0f;
      std::vector<float> l_ref(size_t(N) * E), s_ref(l_ref.size()), g_ref(size_t(N) * K);
      std::vector<int> ex_ref(size_t(N) * K);
      cpu::RouterForward<float>(l_ref.data(), s_ref.data(), ex_ref.data(), g_ref.data(),
                                logits.data(), eye.data(), nullptr, N, E, E, K, scoring, norm,
                                nullptr);
      const KernelCtx& k = Ctx(dtype);
      DevicePtr d_logits = Upload(dtype, logits);
      DevicePtr d_scores = Alloc(l_ref.size() * DataTypeSize(dtype)),
                d_gates = Alloc(g_ref.size() * DataTypeSize(dtype)),
                d_experts = Alloc(ex_ref.size() * sizeof(int));
      ASSERT_OK(MoeRouterForward(k, d_scores.get(), static_cast<int*>(d_experts.get()),
                                 d_gates.get(), d_logits.get(), nullptr, N, E, K, sigmoid, norm));
      ExpectClose(Download(dtype, d_scores.get(), s_ref.size()), s_ref, tol, "router scores");
      ExpectClose(Download(dtype, d_gates.get(), g_ref.size()), g_ref, tol, "router gates");
      std::vector<int> experts(ex_ref.size());
      ASSERT_EQ(cudaMemcpy(experts.data(), d_experts.get(), sizeof(int) * experts.size(),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(experts, ex_ref);

      // The router's backward from the gates' gradient, with a balancing
      // term already in dscores and a z-loss term in dlogits.
      const std::vector<float> dgates = Rounded(dtype, Uniform(rng_, g_ref.size()));
      const std::vector<float> ds0 = Rounded(dtype, Uniform(rng_, s_ref.size(), -0.1f, 0.1f));
      const std::vector<float> dl0 = Rounded(dtype, Uniform(rng_, s_ref.size(), -0.1f, 0.1f));
      const std::vector<float> scores = Rounded(dtype, s_ref);
      std::vector<float> ds_ref = ds0, dl_ref = dl0, dx(size_t(N) * E, 0.0f), dw(eye.size(), 0.0f);
      cpu::RouterBackward<float>(dx.data(), dw.data(), ds_ref.data(), dl_ref.data(), dgates.data(),
                                 logits.data(), eye.data(), scores.data(), ex_ref.data(), N, E, E,
                                 K, scoring, norm, nullptr);
      DevicePtr d_dgates = Upload(dtype, dgates), d_ds = Upload(dtype, ds0),
                d_dl = Upload(dtype, dl0), d_s = Upload(dtype, scores);
      ASSERT_OK(MoeRouterBackward(k, d_dl.get(), d_ds.get(), d_dgates.get(), d_s.get(),
                                  static_cast<const int*>(d_experts.get()), N, E, K, sigmoid,
                                  norm));
      ExpectClose(Download(dtype, d_dl.get(), dl_ref.size()), dl_ref, tol, "router dlogits");
      ExpectClose(Download(dtype, d_ds.get(), ds_ref.size()), ds_ref, tol, "router dscores");

      // Dispatch: permute, combine and their backward on the CPU's index.
      std::vector<int> counts(E), offsets(E + 1), pair_of_row(size_t(N) * K),
          row_of_pair(size_t(N) * K);
      const int dropped = cpu::BuildPermutation(counts.data(), offsets.data(), pair_of_row.data(),
                                                row_of_pair.data(), ex_ref.data(), N, K, E, 0);
      ASSERT_EQ(dropped, 0);
      EXPECT_EQ(counts[E - 1], 0);
      const int M = offsets[E];
      const std::vector<float> x = Rounded(dtype, Uniform(rng_, size_t(N) * C));
      const std::vector<float> y = Rounded(dtype, Uniform(rng_, size_t(M) * C));
      const std::vector<float> gates = Rounded(dtype, g_ref);
      const std::vector<float> dout = Rounded(dtype, Uniform(rng_, size_t(N) * C));
      std::vector<float> xp_ref(size_t(M) * C), out_ref(size_t(N) * C), dy_ref(y.size(), 0.0f),
          dg_ref(gates.size(), 0.0f), dx_ref(x.size(), 0.0f);
      cpu::PermuteForward<float>(xp_ref.data(), x.data(), pair_of_row.data(), M, K, C, nullptr);
      cpu::CombineForward<float>(out_ref.data(), y.data(), gates.data(), row_of_pair.data(), N, K,
                                 C, nullptr);
      cpu::CombineBackward<float>(dy_ref.data(), dg_ref.data(), dout.data(), y.data(), gates.data(),
                                  row_of_pair.data(), N, K, C, nullptr);
      cpu::PermuteBackward<float>(dx_ref.data(), y.data(), row_of_pair.data(), N, K, C, nullptr);
      DevicePtr d_pair_of_row = UploadInts(pair_of_row), d_row_of_pair = UploadInts(row_of_pair);
      DevicePtr d_x = Upload(dtype, x), d_y = Upload(dtype, y), d_gates_in = Upload(dtype, gates),
                d_dout = Upload(dtype, dout);
      DevicePtr d_xp = Alloc(xp_ref.size() * DataTypeSize(dtype)),
                d_out = Alloc(out_ref.size() * DataTypeSize(dtype));
      ASSERT_OK(MoeGatherRows(k, d_xp.get(), d_x.get(),
                              static_cast<const int*>(d_pair_of_row.get()), M, C, K));
      ExpectClose(Download(dtype, d_xp.get(), xp_ref.size()), xp_ref, 0.0, "permuted rows");
      ASSERT_OK(MoeCombineForward(k, d_out.get(), d_y.get(), d_gates_in.get(),
                                  static_cast<const int*>(d_row_of_pair.get()), N, K, C));
      ExpectClose(Download(dtype, d_out.get(), out_ref.size()), out_ref, tol, "combined");
      DevicePtr d_dy = Upload(dtype, std::vector<float>(y.size(), 0.0f)),
                d_dg = Upload(dtype, std::vector<float>(gates.size(), 0.0f)),
                d_dx = Upload(dtype, std::vector<float>(x.size(), 0.0f));
      ASSERT_OK(MoeCombineBackward(k, d_dy.get(), d_dg.get(), d_dout.get(), d_y.get(),
                                   d_gates_in.get(), static_cast<const int*>(d_row_of_pair.get()),
                                   N, K, C));
      ExpectClose(Download(dtype, d_dy.get(), dy_ref.size()), dy_ref, tol, "combine dy");
      ExpectClose(Download(dtype, d_dg.get(), dg_ref.size()), dg_ref, tol, "combine dgates");
      ASSERT_OK(MoePermuteBackward(k, d_dx.get(), d_y.get(),
                                   static_cast<const int*>(d_row_of_pair.get()), N, K, C));
      ExpectClose(Download(dtype, d_dx.get(), dx_ref.size()), dx_ref, tol, "permute dx");
      // The regrouping's scatter undoes the gather.
      DevicePtr d_back = Upload(dtype, std::vector<float>(y.size(), 0.0f));
      std::vector<int> reverse(M);
      for (int r = 0; r < M; ++r) reverse[r] = M - 1 - r;
      DevicePtr d_rev = UploadInts(reverse), d_tmp = Alloc(y.size() * DataTypeSize(dtype));
      ASSERT_OK(
          MoeGatherRows(k, d_tmp.get(), d_y.get(), static_cast<const int*>(d_rev.get()), M, C, 1));
      ASSERT_OK(
          MoeScatterRows(k, d_back.get(), d_tmp.get(), static_cast<const int*>(d_rev.get()), M, C));
      ExpectClose(Download(dtype, d_back.get(), y.size()), y, 0.0, "gather then scatter");
    }
  }
}

}  // namespace
}  // namespace shardtrain::engine::cuda
