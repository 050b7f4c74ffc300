#include "common/buffer.h"

#include <cassert>
#include <cstdlib>
#include <new>

namespace asyncps {

std::shared_ptr<Buffer> Buffer::Allocate(size_t bytes) {
  std::shared_ptr<Buffer> b(new Buffer());
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  b->data_ = static_cast<uint8_t*>(p);
  b->size_ = bytes;
  b->capacity_ = bytes;
  b->aligned_alloc_ = true;
  return b;
}

std::shared_ptr<Buffer> Buffer::FromVector(std::vector<uint8_t>&& bytes) {
  std::shared_ptr<Buffer> b(new Buffer());
  b->vec_ = std::move(bytes);
  b->data_ = b->vec_.data();
  b->size_ = b->vec_.size();
  b->capacity_ = b->size_;
  return b;
}

Buffer::~Buffer() {
  if (aligned_alloc_) std::free(data_);
}

void Buffer::Truncate(size_t n) {
  assert(n <= capacity_);
  size_ = n;
}

}  // namespace asyncps
