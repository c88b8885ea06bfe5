// PageBuffer: a zero-filled float array backed by its own anonymous memory
// mapping, so that ranges of it can be handed back to the operating system
// and so that what is really resident can be measured.
//
// Why not std::vector: ZeRO-2/3 keep a whole-model parameter and gradient
// buffer (the engine computes on the flat layout) but only some units of it
// are live at a time. A mapping is committed page by page on first touch, so
// untouched units cost nothing; Release() zeroes a range and returns its
// whole pages (MADV_DONTNEED: they read back as zeros and are committed again
// when next written); ResidentBytes() asks the kernel (mincore) how much of a
// range is in RAM, which is what the memory accounting reports as measured.
//
// Thread-compatible: Release() and writes to the same range must not race;
// ResidentBytes() may run concurrently with anything (it only reads page
// tables).
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_PAGE_BUFFER_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_PAGE_BUFFER_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace shardtrain::engine::cpu {

class PageBuffer {
 public:
  // `count` floats, all 0, none resident yet. Aborts with a message when the
  // mapping cannot be made (out of memory, as std::vector would throw).
  explicit PageBuffer(size_t count = 0);
  ~PageBuffer();
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return count_; }
  absl::Span<float> span() { return absl::MakeSpan(data_, count_); }
  absl::Span<const float> span() const { return absl::MakeConstSpan(data_, count_); }

  // Sets [begin, begin + n) to 0; the pages lying wholly inside it go back to
  // the OS (the partial pages at its ends are zeroed in place, since they are
  // shared with the neighbouring elements). Precondition: begin + n <= size().
  void Release(size_t begin, size_t n);
  void ReleaseAll() { Release(0, count_); }

  // Keeps the huge page (2 MiB) containing element `offset` from being
  // used, so that ranges on either side of `offset` are committed and
  // released independently. A hint: without transparent huge pages a no-op.
  void NoHugePagesAt(size_t offset);

  // Bytes of the pages overlapping [begin, begin + n) that are resident now.
  int64_t ResidentBytes(size_t begin, size_t n) const;
  int64_t ResidentBytes() const { return ResidentBytes(0, count_); }

  static size_t PageSize();

 private:
  float* data_ = nullptr;
  size_t count_ = 0;
  size_t mapped_bytes_ = 0;
};

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_PAGE_BUFFER_H_
