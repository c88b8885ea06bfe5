#include "worker/model/page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace shardtrain::model {

size_t PageBuffer::PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

PageBuffer::PageBuffer(size_t count) : count_(count) {
  if (count == 0) return;
  const size_t page = PageSize();
  mapped_bytes_ = (count * sizeof(float) + page - 1) / page * page;
  void* p =
      mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "PageBuffer: cannot map %zu bytes: %s\n", mapped_bytes_,
                 std::strerror(errno));
    std::abort();
  }
  data_ = static_cast<float*>(p);
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
  char* const first =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(lo) + page - 1) & ~(page - 1));
  char* const last = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(hi) & ~(page - 1));
  if (first >= last) {  // no whole page inside
    std::memset(lo, 0, hi - lo);
    return;
  }
  std::memset(lo, 0, first - lo);
  std::memset(last, 0, hi - last);
  if (madvise(first, last - first, MADV_DONTNEED) != 0) std::memset(first, 0, last - first);
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

}  // namespace shardtrain::model
