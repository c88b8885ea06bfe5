#include "worker/comm/gloo_rings.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "gloo/common/error.h"

namespace shardtrain::comm {
namespace {

// Slots (Gloo's message tags for unbound buffers) of the ring collectives;
// point-to-point ops use kP2PSlotBase and up (gloo_communicator.cc).
constexpr uint64_t kReduceScatterSlot = 0xA1ull << 56;
constexpr uint64_t kAllReduceSlot = 0xA3ull << 56;
constexpr uint64_t kAllGatherSlot = 0xA4ull << 56;
constexpr uint64_t kBroadcastSlot = 0xA5ull << 56;
constexpr uint64_t kAllToAllSlot = 0xA6ull << 56;
constexpr size_t kSegmentBytes = 1 << 20;

// acc (op)= in elementwise.
void ReduceFloats(ReduceOp op, float* acc, const float* in, size_t n) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  }
}

// out = a (op) b elementwise; out may alias a.
void CombineFloats(ReduceOp op, float* out, const float* a, const float* b, size_t n) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
}

}  // namespace

void ScaleFloats(float* data, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) data[i] *= factor;
}

GlooRings::GlooRings(int rank, int size, WaitFn wait)
    : rank_(rank), size_(size), wait_(std::move(wait)) {}

void GlooRings::WaitRecv(gloo::transport::UnboundBuffer* b, absl::Time deadline,
                         absl::string_view what) {
  wait_(b, /*send=*/false, deadline, what);
}

void GlooRings::WaitSend(gloo::transport::UnboundBuffer* b, absl::Time deadline,
                         absl::string_view what) {
  wait_(b, /*send=*/true, deadline, what);
}

// Ring all-reduce in place on fp32 `data`: a reduce-scatter ring (as in
// ReduceScatter) over n nearly equal blocks, then an all-gather ring
// receiving straight into `data`. Every segment of a step is posted at
// once so TCP never idles between segments.
void GlooRings::AllReduce(float* data, size_t count, ReduceOp op, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const size_t n = static_cast<size_t>(size_);
  const size_t base = count / n, rem = count % n;
  auto block_off = [&](size_t b) { return b * base + std::min(b, rem); };
  auto block_len = [&](size_t b) { return base + (b < rem ? 1 : 0); };
  if (tmp_.size() < base + 1) tmp_.resize(base + 1);
  auto data_buf = ctx_->createUnboundBuffer(data, count * 4);
  auto tmp_buf = ctx_->createUnboundBuffer(tmp_.data(), (base + 1) * 4);
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  const size_t seg = kSegmentBytes / 4;
  // Reduce-scatter: after n-1 steps block r holds every contribution.
  for (size_t step = 0; step + 1 < n; ++step) {
    const size_t sb = (rank_ + 2 * n - step - 1) % n;
    const size_t rb = (rank_ + 2 * n - step - 2) % n;
    size_t recvs = 0, sends = 0;
    PostSegments(tmp_buf.get(), false, left, kAllReduceSlot, 0, block_len(rb), &recvs);
    PostSegments(data_buf.get(), true, right, kAllReduceSlot, block_off(sb), block_len(sb), &sends);
    float* dst = data + block_off(rb);
    for (size_t j = 0; j < recvs; ++j) {
      WaitRecv(tmp_buf.get(), deadline, "AllReduce");
      const size_t off = j * seg;
      ReduceFloats(op, dst + off, tmp_.data() + off, std::min(seg, block_len(rb) - off));
    }
    for (size_t j = 0; j < sends; ++j) WaitSend(data_buf.get(), deadline, "AllReduce");
  }
  // All-gather: step s forwards block (r-s) and receives block (r-s-1).
  for (size_t step = 0; step + 1 < n; ++step) {
    const size_t sb = (rank_ + 2 * n - step) % n;
    const size_t rb = (rank_ + 2 * n - step - 1) % n;
    size_t recvs = 0, sends = 0;
    PostSegments(data_buf.get(), false, left, kAllReduceSlot + 1, block_off(rb), block_len(rb),
                 &recvs);
    PostSegments(data_buf.get(), true, right, kAllReduceSlot + 1, block_off(sb), block_len(sb),
                 &sends);
    for (size_t j = 0; j < recvs; ++j) WaitRecv(data_buf.get(), deadline, "AllReduce");
    for (size_t j = 0; j < sends; ++j) WaitSend(data_buf.get(), deadline, "AllReduce");
  }
}

// Ring reduce-scatter in fp32. At step s (0..n-2) rank r sends its partial
// block (r-s-1) to r+1 and combines the partial block (r-s-2) received from
// r-1 with its own input block; after n-1 steps block r holds all n
// contributions. fp32 input is read in place (step 0 sends straight from
// it, the last step writes straight into the output); 16-bit input is
// first converted to an fp32 copy. The partial block combined at step s is
// the one sent at step s + 1, so two block-sized halves of acc_ alternate
// (scratch: 3 blocks, not the whole input).
void GlooRings::ReduceScatter(const OpArgs& a, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const size_t n = static_cast<size_t>(size_);
  const size_t count = a.count;
  if (acc_.size() < 2 * count) acc_.resize(2 * count);
  if (tmp_.size() < count) tmp_.resize(count);
  const float* src = static_cast<const float*>(a.input);
  if (a.dtype != DataType::kFloat32) {
    if (in32_.size() < n * count) in32_.resize(n * count);
    ToFloat32(a.dtype, a.input, in32_.data(), n * count);
    src = in32_.data();
  }
  float* final_out = static_cast<float*>(a.output);
  if (a.dtype != DataType::kFloat32) {
    if (out32_.size() < count) out32_.resize(count);
    final_out = out32_.data();
  }
  auto src_buf = ctx_->createUnboundBuffer(const_cast<float*>(src), n * count * 4);
  auto acc_buf = ctx_->createUnboundBuffer(acc_.data(), 2 * count * 4);
  auto tmp_buf = ctx_->createUnboundBuffer(tmp_.data(), count * 4);
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  const size_t seg = kSegmentBytes / 4;
  for (size_t step = 0; step + 1 < n; ++step) {
    const size_t sb = (rank_ + 2 * n - step - 1) % n;
    const size_t rb = (rank_ + 2 * n - step - 2) % n;
    gloo::transport::UnboundBuffer* send_from = step == 0 ? src_buf.get() : acc_buf.get();
    const size_t send_offset = step == 0 ? sb * count : ((step - 1) % 2) * count;
    size_t recvs = 0, sends = 0;
    PostSegments(tmp_buf.get(), false, left, kReduceScatterSlot, 0, count, &recvs);
    PostSegments(send_from, true, right, kReduceScatterSlot, send_offset, count, &sends);
    float* dst = step + 2 == n ? final_out : acc_.data() + (step % 2) * count;
    const float* mine = src + rb * count;
    for (size_t j = 0; j < recvs; ++j) {
      WaitRecv(tmp_buf.get(), deadline, "ReduceScatter");
      const size_t off = j * seg, len = std::min(seg, count - off);
      CombineFloats(a.reduce, dst + off, mine + off, tmp_.data() + off, len);
    }
    for (size_t j = 0; j < sends; ++j) WaitSend(send_from, deadline, "ReduceScatter");
  }
  if (a.reduce == ReduceOp::kAvg) ScaleFloats(final_out, count, 1.0f / size_);
  if (a.dtype != DataType::kFloat32) FromFloat32(a.dtype, final_out, a.output, count);
}

// Ring all-gather: copy our block into place, then at step s forward block
// (r-s) to r+1 while receiving block (r-s-1) from r-1, straight into
// `out`.
void GlooRings::AllGather(const uint8_t* in, uint8_t* out, size_t bytes, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const size_t n = static_cast<size_t>(size_);
  uint8_t* own = out + static_cast<size_t>(rank_) * bytes;
  if (own != in) std::memcpy(own, in, bytes);  // in == own: in place
  auto buf = ctx_->createUnboundBuffer(out, n * bytes);
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  for (size_t step = 0; step + 1 < n; ++step) {
    const size_t sb = (rank_ + 2 * n - step) % n;
    const size_t rb = (rank_ + 2 * n - step - 1) % n;
    const size_t recvs = PostBytes(buf.get(), false, left, kAllGatherSlot, rb * bytes, bytes);
    const size_t sends = PostBytes(buf.get(), true, right, kAllGatherSlot, sb * bytes, bytes);
    for (size_t j = 0; j < recvs; ++j) WaitRecv(buf.get(), deadline, "AllGather");
    for (size_t j = 0; j < sends; ++j) WaitSend(buf.get(), deadline, "AllGather");
  }
}

// Pipelined chain broadcast: ranks in order root, root+1, ...; each
// receives segment j from its predecessor and forwards it at once, so the
// time is ~ bytes / bandwidth + (n-2) segment latencies.
void GlooRings::Broadcast(uint8_t* data, size_t bytes, int root, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const int pos = (rank_ - root + size_) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  const int next = (rank_ + 1) % size_;
  const bool forward = pos + 1 < size_;
  auto buf = ctx_->createUnboundBuffer(data, bytes);
  size_t sends = 0;
  if (pos == 0) {
    sends = PostBytes(buf.get(), true, next, kBroadcastSlot, 0, bytes);
  } else {
    const size_t recvs = PostBytes(buf.get(), false, prev, kBroadcastSlot, 0, bytes);
    for (size_t j = 0; j < recvs; ++j) {
      WaitRecv(buf.get(), deadline, "Broadcast");
      if (forward) {
        const size_t off = j * kSegmentBytes;
        buf->send(next, kBroadcastSlot, off, std::min(kSegmentBytes, bytes - off));
        ++sends;
      }
    }
  }
  for (size_t j = 0; j < sends; ++j) WaitSend(buf.get(), deadline, "Broadcast");
}

// Posts the transfer of elements [off, off+len) of `buf` (fp32) in
// segments: sends to `right` if `send`, else receives from `left`.
void GlooRings::PostSegments(gloo::transport::UnboundBuffer* buf, bool send, int peer,
                             uint64_t slot, size_t off, size_t len, size_t* posted) {
  const size_t seg = kSegmentBytes / 4;
  for (size_t j = 0; j < len; j += seg) {
    const size_t n = std::min(seg, len - j);
    if (send) {
      buf->send(peer, slot, (off + j) * 4, n * 4);
    } else {
      buf->recv(peer, slot, (off + j) * 4, n * 4);
    }
    ++*posted;
  }
}

void GlooRings::AllToAllV(const OpArgs& a, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const size_t esz = DataTypeSize(a.dtype);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs, sends;
  std::vector<size_t> recv_posts, send_posts;  // segments posted on each
  size_t in = 0, out = 0;                      // element offsets of peer p's blocks
  for (int p = 0; p < size_; ++p) {
    const size_t ns = a.send_counts[p], nr = a.recv_counts[p];
    char* const dst = static_cast<char*>(a.output) + out * esz;
    char* const src = static_cast<char*>(const_cast<void*>(a.input)) + in * esz;
    in += ns;
    out += nr;
    if (p == rank_) {
      if (ns != nr) {
        throw gloo::IoException(absl::StrCat("AllToAllV: rank ", rank_, " sends itself ", ns,
                                             " elements but expects ", nr));
      }
      if (ns > 0) std::memcpy(dst, src, ns * esz);
      continue;
    }
    if (nr > 0) {
      recvs.push_back(ctx_->createUnboundBuffer(dst, nr * esz));
      recv_posts.push_back(PostBytes(recvs.back().get(), false, p, kAllToAllSlot, 0, nr * esz));
    }
    if (ns > 0) {
      sends.push_back(ctx_->createUnboundBuffer(src, ns * esz));
      send_posts.push_back(PostBytes(sends.back().get(), true, p, kAllToAllSlot, 0, ns * esz));
    }
  }
  for (size_t k = 0; k < recvs.size(); ++k) {
    for (size_t j = 0; j < recv_posts[k]; ++j) WaitRecv(recvs[k].get(), deadline, "AllToAllV");
  }
  for (size_t k = 0; k < sends.size(); ++k) {
    for (size_t j = 0; j < send_posts[k]; ++j) WaitSend(sends[k].get(), deadline, "AllToAllV");
  }
}

size_t GlooRings::PostBytes(gloo::transport::UnboundBuffer* buf, bool send, int peer, uint64_t slot,
                            size_t off, size_t len) {
  size_t posted = 0;
  for (size_t j = 0; j < len; j += kSegmentBytes) {
    const size_t n = std::min(kSegmentBytes, len - j);
    if (send) {
      buf->send(peer, slot, off + j, n);
    } else {
      buf->recv(peer, slot, off + j, n);
    }
    ++posted;
  }
  return posted;
}

}  // namespace shardtrain::comm
