// Helpers shared by the collective tests: typed host buffers and a runner
// that starts one thread per rank, each with its own Gloo communicator over
// real TCP on 127.0.0.1.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_COMM_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_COMM_TEST_UTIL_H_

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace shardtrain::comm::testing {

// `count` elements of `dtype`, read and written as float.
class TypedBuffer {
 public:
  TypedBuffer(DataType dtype, size_t count)
      : dtype_(dtype), count_(count), bytes_(count * DataTypeSize(dtype) + 8) {}
  void* data() { return bytes_.data(); }
  size_t count() const { return count_; }
  float Get(size_t i) const {
    float f;
    FromBytes(i, &f);
    return f;
  }
  void Set(size_t i, float v) {
    if (dtype_ == DataType::kFloat32) {
      std::memcpy(&bytes_[i * 4], &v, 4);
    } else {
      FromFloat32(dtype_, &v, &bytes_[i * 2], 1);
    }
  }

 private:
  void FromBytes(size_t i, float* f) const {
    ToFloat32(dtype_, &bytes_[i * DataTypeSize(dtype_)], f, 1);
  }
  DataType dtype_;
  size_t count_;
  std::vector<uint8_t> bytes_;
};

// Values exactly representable in bf16/fp16 and whose sums over <= 8 ranks
// stay exact in every dtype.
inline float TestValue(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 3) % 17) - 8) +
         0.5f * static_cast<float>((rank + i) % 2);
}

// Relative tolerance of one rounding to `dtype`.
inline float Tolerance(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return 1e-6f;
    case DataType::kBFloat16:
      return 1.0f / 128;
    case DataType::kFloat16:
      return 1.0f / 1024;
  }
  return 0;
}

// Runs `body(comm)` on `world` threads with fresh communicators sharing an
// in-memory store, then shuts them down.
inline void RunRanks(int world, const std::function<void(Communicator&)>& body,
                     GlooOptions options = GlooOptions()) {
  auto store = std::make_shared<InMemoryStore>();
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (options.prefix == "default" && info != nullptr) {
    options.prefix = std::string(info->test_suite_name()) + "/" + info->name();
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = CreateGlooCommunicator(store, r, world, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
      EXPECT_TRUE((*comm)->Shutdown().ok() || !(*comm)->health().ok());
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace shardtrain::comm::testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_COMM_TEST_UTIL_H_
