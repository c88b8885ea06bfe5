#include "worker/parallel/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/parallel/ddp.h"
#include "worker/parallel/zero.h"

namespace shardtrain::parallel {

double SquaredNormOutside(engine::FlatMath& math, const float* grads, size_t count, size_t offset,
                          const FlatRanges& skip) {
  double squared = 0;
  ForEachOutside(offset, offset + count, skip, [&](size_t first, size_t last) {
    squared += math.SquaredNorm(grads + (first - offset), last - first);
  });
  return squared;
}

double SquaredNormOutside(absl::Span<const float> grads, size_t offset, const FlatRanges& skip,
                          engine::ThreadPool* pool) {
  engine::HostFlatMath host(pool);
  return SquaredNormOutside(host, grads.data(), grads.size(), offset, skip);
}

namespace {

// A buffer of n floats in host memory (on_device false) or `engine`'s, and
// the math over it.
struct Scratch {
  Scratch(engine::Engine& engine, bool on_device, size_t n)
      : host_math(engine.host_pool()),
        math(on_device ? engine.math() : host_math),
        buffer(math.Allocate(n)) {}
  float* data() { return buffer->as<float>(); }
  engine::HostFlatMath host_math;
  engine::FlatMath& math;
  std::unique_ptr<engine::Buffer> buffer;
};

bool OffHost(engine::Engine& engine, bool in_engine) {
  return in_engine && engine.math().kind() != DeviceKind::kCpu;
}

}  // namespace

absl::Status SumInPlace(const ModelParallelGrads& mp, engine::Engine& engine, bool in_engine,
                        float* data, size_t n,
                        const std::function<absl::Status(absl::Span<float>)>& sum) {
  const bool on_device = OffHost(engine, in_engine);
  if (on_device == mp.device_memory || n == 0) return sum(absl::MakeSpan(data, n));
  Scratch there(engine, mp.device_memory, n);  // where `sum` takes it
  engine::FlatMath& math = engine.math();
  if (on_device) {
    math.CopyToHost(there.data(), data, n);
  } else {
    math.CopyFromHost(there.data(), data, n);
  }
  if (absl::Status s = sum(absl::MakeSpan(there.data(), n)); !s.ok()) return s;
  if (on_device) {
    math.CopyFromHost(data, there.data(), n);
  } else {
    math.CopyToHost(data, there.data(), n);
  }
  return absl::OkStatus();
}

absl::Status SumTpPartials(const ModelParallelGrads& mp, engine::Engine& engine, bool in_engine,
                           float* grads, size_t size, size_t offset) {
  if (!mp.has_tp_partials()) return absl::OkStatus();
  const size_t end = offset + size;
  std::vector<std::pair<size_t, size_t>> parts;  // [first, last) in grads' coordinates
  size_t total = 0;
  for (const auto& [begin, stop] : mp.tp_partial) {
    const size_t first = std::max(begin, offset), last = std::min(stop, end);
    if (first >= last) continue;
    parts.emplace_back(first - offset, last - offset);
    total += last - first;
  }
  if (total == 0) return absl::OkStatus();
  const bool on_device = OffHost(engine, in_engine);
  Scratch packed(engine, on_device, total);  // beside the gradients
  size_t at = 0;
  for (const auto& [first, last] : parts) {
    packed.math.Accumulate(packed.data() + at, grads + first, last - first, /*add=*/false);
    at += last - first;
  }
  if (absl::Status s = SumInPlace(mp, engine, on_device, packed.data(), total, mp.sum_tp);
      !s.ok()) {
    return s;
  }
  at = 0;
  for (const auto& [first, last] : parts) {
    packed.math.Accumulate(grads + first, packed.data() + at, last - first, /*add=*/false);
    at += last - first;
  }
  return absl::OkStatus();
}

const engine::Event* AfterComputeWork(engine::Device& device,
                                      std::vector<std::unique_ptr<engine::Event>>* keep) {
  absl::StatusOr<std::unique_ptr<engine::Event>> e = device.NewEvent();
  if (e.ok() && (*e)->Record(device.compute_stream()).ok()) {
    keep->push_back(*std::move(e));
    return keep->back().get();
  }
  // The op must not run ahead of the kernels: order it on the host.
  device.compute_stream().Synchronize().IgnoreError();
  return nullptr;
}

void ForgetFinished(std::vector<std::shared_ptr<comm::Work>>* in_flight,
                    std::vector<std::unique_ptr<engine::Event>>* events) {
  in_flight->erase(std::remove_if(in_flight->begin(), in_flight->end(),
                                  [](const std::shared_ptr<comm::Work>& w) {
                                    return w->Done() && w->Wait().ok();  // failures stay
                                  }),
                   in_flight->end());
  if (in_flight->empty()) events->clear();
}

absl::Status StreamOrderedOps::Run(
    engine::Device& device,
    const std::function<std::shared_ptr<comm::Work>(const engine::Event*)>& submit) {
  ForgetFinished(&in_flight_, &events_);
  const engine::Event* after = AfterComputeWork(device, &events_);
  std::shared_ptr<comm::Work> work = submit(after);
  absl::Status s = work->BlockStream(device.compute_stream());
  in_flight_.push_back(std::move(work));
  return s;
}

absl::Status StreamOrderedOps::Finish(absl::Status status) {
  for (const std::shared_ptr<comm::Work>& w : in_flight_) {
    absl::Status s = w->Wait();
    if (status.ok()) status = s;
  }
  in_flight_.clear();
  events_.clear();
  return status;
}

absl::Status AllReduceSumNow(comm::Communicator& comm, engine::Engine& engine, float* data,
                             size_t n) {
  std::vector<std::unique_ptr<engine::Event>> keep;
  const engine::Event* after =
      comm.device_memory() ? AfterComputeWork(engine.device(), &keep) : nullptr;
  return comm.AllReduceAsync(data, n, comm::DataType::kFloat32, comm::ReduceOp::kSum, after)
      ->Wait();
}

absl::StatusOr<double> SumOverGroup(comm::Communicator* comm, double local,
                                    engine::FlatMath* device,
                                    std::unique_ptr<engine::Buffer>* scratch) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  if (comm == nullptr || comm->size() == 1) return local;
  // AllGather moves fp32 bytes unchanged, so the doubles arrive bit-exact.
  const size_t n = size_t(comm->size());
  std::vector<float> all(2 + 2 * n);  // [mine | everyone's]
  std::memcpy(all.data(), &local, sizeof(local));
  if (!comm->device_memory()) {
    if (absl::Status s = comm->AllGather(all.data(), all.data() + 2, 2, comm::DataType::kFloat32);
        !s.ok()) {
      return s;
    }
  } else {  // the group reads device memory: through a scratch there
    if (device == nullptr || device->kind() == DeviceKind::kCpu) {
      return absl::InternalError("SumOverGroup: a device communicator without device memory");
    }
    std::unique_ptr<engine::Buffer> own;
    if (scratch == nullptr) scratch = &own;
    if (*scratch == nullptr || (*scratch)->count() < all.size()) {
      *scratch = device->Allocate(all.size());
    }
    float* d = (*scratch)->as<float>();
    device->CopyFromHost(d, all.data(), 2);
    if (absl::Status s = comm->AllGather(d, d + 2, 2, comm::DataType::kFloat32); !s.ok()) return s;
    device->CopyToHost(all.data() + 2, d + 2, 2 * n);
  }
  double total = 0;
  for (size_t r = 0; r < n; ++r) {
    double v;
    std::memcpy(&v, &all[2 + 2 * r], sizeof(v));
    total += v;
  }
  return total;
}

absl::StatusOr<std::unique_ptr<DataParallel>> MakeDataParallel(const ParallelSpec& parallel,
                                                               engine::Engine* engine,
                                                               const optim::AdamWOptions& adamw,
                                                               comm::Communicator* comm,
                                                               comm::Communicator* expert_comm) {
  if (parallel.zero == 0) {
    auto ddp =
        Ddp::Create(engine, adamw, comm, size_t(parallel.bucket_mb) << 20,
                    /*stage_through_host=*/false, parallel.offload == OffloadMode::kOptimizer,
                    parallel.reduce_dtype == ReduceDtype::kBf16);
    if (!ddp.ok()) return ddp.status();
    return std::unique_ptr<DataParallel>(*std::move(ddp));
  }
  ZeroOptions o;
  o.stage = parallel.zero;
  o.reshard_after_forward = parallel.reshard_after_forward;
  o.offload_optimizer = parallel.offload == OffloadMode::kOptimizer;
  o.split_experts = parallel.ep > 1;
  o.expert_comm = expert_comm;
  auto zero = Zero::Create(o, engine, adamw, comm);
  if (!zero.ok()) return zero.status();
  return std::unique_ptr<DataParallel>(*std::move(zero));
}

}  // namespace shardtrain::parallel
