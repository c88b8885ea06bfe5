// GlooRings: the ring collectives of the Gloo backend (gloo_communicator.h)
// on fp32 buffers, written on Gloo's unbound buffers so that every segment
// of a step is in flight at once and a wait can be aborted when a peer
// fails: all-reduce (reduce-scatter ring + all-gather ring), reduce-scatter,
// all-gather, a pipelined chain broadcast, and all-to-all-v (every pair of
// ranks at once).
//
// Internal to worker/comm: GlooCommunicator runs these on its comm thread,
// one op at a time; errors are thrown as gloo::IoException (by the wait
// function or Gloo) and turned into statuses there. Scratch buffers persist
// between ops and grow to the largest: all-reduce one block (count/size + 1),
// reduce-scatter three blocks (plus fp32 copies for 16-bit input).
//
// Not thread-safe: one op at a time.
#ifndef SHARDTRAIN_WORKER_COMM_GLOO_RINGS_H_
#define SHARDTRAIN_WORKER_COMM_GLOO_RINGS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/communicator.h"
#include "worker/comm/types.h"

namespace shardtrain::comm {

// data[i] *= factor.
void ScaleFloats(float* data, size_t n, float factor);

class GlooRings {
 public:
  // Blocks until one send (send = true) or receive on `buffer` completes or
  // `deadline` passes; throws gloo::IoException naming `what` on failure.
  using WaitFn = std::function<void(gloo::transport::UnboundBuffer* buffer, bool send,
                                    absl::Time deadline, absl::string_view what)>;

  GlooRings(int rank, int size, WaitFn wait);

  // The connected context the ops run on (null: none yet / shut down).
  void set_context(std::shared_ptr<gloo::Context> ctx) { ctx_ = std::move(ctx); }

  // In place on fp32 `data`, reduced with `op` (kAvg sums: the caller scales).
  void AllReduce(float* data, size_t count, ReduceOp op, absl::Duration timeout);
  // a.input[count * size] -> a.output[count], any dtype (reduced in fp32).
  void ReduceScatter(const OpArgs& a, absl::Duration timeout);
  // in[bytes] -> out[bytes * size], rank r's block at r; in may be out's own block.
  void AllGather(const uint8_t* in, uint8_t* out, size_t bytes, absl::Duration timeout);
  // data[bytes] from `root` to every rank.
  void Broadcast(uint8_t* data, size_t bytes, int root, absl::Duration timeout);
  // OpArgs' kAllToAllV, any dtype: a receive from and a send to each other
  // rank with elements to move (none for a zero count: both sides know it),
  // this rank's own block copied.
  void AllToAllV(const OpArgs& a, absl::Duration timeout);

 private:
  void WaitRecv(gloo::transport::UnboundBuffer* b, absl::Time deadline, absl::string_view what);
  void WaitSend(gloo::transport::UnboundBuffer* b, absl::Time deadline, absl::string_view what);
  // Posts the transfer of elements [off, off+len) of `buf` (fp32) in
  // segments: sends to `peer` if `send`, else receives from it.
  void PostSegments(gloo::transport::UnboundBuffer* buf, bool send, int peer, uint64_t slot,
                    size_t off, size_t len, size_t* posted);
  // Posts byte range [off, off+len) of `buf` in segments; returns how many.
  size_t PostBytes(gloo::transport::UnboundBuffer* buf, bool send, int peer, uint64_t slot,
                   size_t off, size_t len);

  const int rank_, size_;
  const WaitFn wait_;
  std::shared_ptr<gloo::Context> ctx_;
  std::vector<float> acc_, tmp_, in32_, out32_;
};

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_GLOO_RINGS_H_
