// cuda/scratch.h — carving one device workspace into the typed pieces a composite op (the head, the block)
// needs, with the same code measuring its size.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lt::cuda {

// Carves typed pieces out of one workspace, each 256-byte aligned; with a null base it only measures (bytes()).
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(int64_t count) {
    T* at = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (size_t(count) * sizeof(T) + 255) / 256 * 256;
    return at;
  }
  void* take_bytes(size_t bytes) { return take<unsigned char>(int64_t(bytes)); }
  size_t bytes() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

}  // namespace lt::cuda
