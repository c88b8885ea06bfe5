#include "worker/engine/cpu/page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace shardtrain::engine::cpu {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

size_t PageBuffer::PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

PageBuffer::PageBuffer(size_t count) : count_(count) {
  if (count == 0) return;
  const size_t page = PageSize();
  mapped_bytes_ = (count * sizeof(float) + page - 1) / page * page;
  // Large buffers are refilled unit by unit (ZeRO-2/3 release and re-gather
  // tens of MB per unit): transparent huge pages cut the page faults of a
  // refill 512-fold where the kernel allows them. They need 2 MiB-aligned
  // ranges, so a large mapping is made 2 MiB longer and trimmed to align.
  const bool huge = mapped_bytes_ >= kHugePage;
  const size_t reserve = mapped_bytes_ + (huge ? kHugePage : 0);
  void* p = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "PageBuffer: cannot map %zu bytes: %s\n", reserve, std::strerror(errno));
    std::abort();
  }
  char* base = static_cast<char*>(p);
  if (huge) {
    char* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) &
                                            ~uintptr_t{kHugePage - 1});
    if (aligned > base) munmap(base, aligned - base);
    char* end = aligned + mapped_bytes_;
    if (base + reserve > end) munmap(end, base + reserve - end);
    base = aligned;
    madvise(base, mapped_bytes_, MADV_HUGEPAGE);  // a hint: errors ignored
  }
  data_ = reinterpret_cast<float*>(base);
}

PageBuffer::~PageBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_bytes_);
}

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, mapped_bytes_);
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
  }
  return *this;
}

void PageBuffer::Release(size_t begin, size_t n) {
  if (n == 0) return;
  const uintptr_t page = PageSize();
  char* const lo = reinterpret_cast<char*>(data_ + begin);
  char* const hi = reinterpret_cast<char*>(data_ + begin + n);
  // Zeroes [a, b) inside one page unless that page is not resident: then it
  // reads as zeros already, and writing would commit it (with huge pages, a
  // whole 2 MiB of it).
  auto zero_part = [page](char* a, char* b) {
    if (a >= b) return;
    unsigned char resident = 1;
    char* start = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(a) & ~(page - 1));
    if (mincore(start, page, &resident) == 0 && (resident & 1) == 0) return;
    std::memset(a, 0, b - a);
  };
  char* const first =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(lo) + page - 1) & ~(page - 1));
  char* const last = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(hi) & ~(page - 1));
  if (first >= last) {  // no whole page inside: at most two partial pages
    char* const mid = std::min(hi, first);
    zero_part(lo, mid);
    zero_part(mid, hi);
    return;
  }
  zero_part(lo, first);
  zero_part(last, hi);
  if (madvise(first, last - first, MADV_DONTNEED) != 0) std::memset(first, 0, last - first);
}

void PageBuffer::NoHugePagesAt(size_t offset) {
  if (mapped_bytes_ < kHugePage || offset >= count_) return;
  char* const base = reinterpret_cast<char*>(data_);
  const uintptr_t at = reinterpret_cast<uintptr_t>(data_ + offset) & ~uintptr_t{kHugePage - 1};
  char* const start = std::max(base, reinterpret_cast<char*>(at));
  char* const end = std::min(base + mapped_bytes_, reinterpret_cast<char*>(at) + kHugePage);
  madvise(start, end - start, MADV_NOHUGEPAGE);  // a hint: errors ignored
}

int64_t PageBuffer::ResidentBytes(size_t begin, size_t n) const {
  if (n == 0) return 0;
  const uintptr_t page = PageSize();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_ + begin) & ~(page - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(data_ + begin + n);
  const size_t pages = (hi - lo + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  if (mincore(reinterpret_cast<void*>(lo), pages * page, vec.data()) != 0) return -1;
  int64_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return resident * static_cast<int64_t>(page);
}

}  // namespace shardtrain::engine::cpu
