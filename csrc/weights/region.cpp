// Region constructors.
#include "weights/region.h"

namespace rlboost {

Status Region::CreateShared(uint64_t nbytes, std::shared_ptr<Region>* out) {
  std::unique_ptr<SharedMapping> m;
  RLB_RETURN_IF_ERROR(SharedMapping::Create(nbytes, &m));
  uint8_t* data = m->data();
  out->reset(new Region(std::move(m), data, nbytes));
  return Status::Ok();
}

std::shared_ptr<Region> Region::Borrow(uint8_t* data, uint64_t nbytes) {
  return std::shared_ptr<Region>(new Region(nullptr, data, nbytes));
}

}  // namespace rlboost
