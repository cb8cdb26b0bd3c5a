// Region: the bytes of one version on a server. Either owned shared memory (a memfd a
// same-host puller can map) or borrowed memory whose owner (Python) keeps it alive until
// the version is retired from every server.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/shm/shm_region.h"

namespace rlboost {

class Region {
 public:
  static Status CreateShared(uint64_t nbytes, std::shared_ptr<Region>* out);
  static std::shared_ptr<Region> Borrow(uint8_t* data, uint64_t nbytes);

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return shared_ ? shared_->fd() : -1; }
  bool owned() const { return shared_ != nullptr; }

 private:
  Region(std::unique_ptr<SharedMapping> shared, uint8_t* data, uint64_t size)
      : shared_(std::move(shared)), data_(data), size_(size) {}
  std::unique_ptr<SharedMapping> shared_;
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace rlboost
