// memfd-backed regions and read-only mappings of another process's region.
#include "transport/shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace rlboost {
namespace {

Status Errno(const std::string& what) {
  return Status(Code::kIo, what + ": " + std::strerror(errno));
}

}  // namespace

SharedMapping::~SharedMapping() {
  if (data_ != nullptr && size_ > 0) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

Status SharedMapping::Create(uint64_t nbytes, std::unique_ptr<SharedMapping>* out) {
  int fd = memfd_create("rlboost-weights", MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(nbytes)) != 0) {
    Status s = Errno("ftruncate(" + std::to_string(nbytes) + ")");
    close(fd);
    return s;
  }
  void* p = nullptr;
  if (nbytes > 0) {
    p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      Status s = Errno("mmap of " + std::to_string(nbytes) + " shared bytes");
      close(fd);
      return s;
    }
  }
  out->reset(new SharedMapping(static_cast<uint8_t*>(p), nbytes, fd));
  return Status::Ok();
}

Status SharedMapping::OpenRemote(uint32_t pid, int fd, uint64_t nbytes,
                                 std::unique_ptr<SharedMapping>* out) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (local < 0) return Errno("open " + path);
  struct stat st;
  if (fstat(local, &st) != 0 || static_cast<uint64_t>(st.st_size) < nbytes) {
    close(local);
    return Status(Code::kProtocol, "shared region is smaller than announced");
  }
  void* p = nullptr;
  if (nbytes > 0) {
    p = mmap(nullptr, nbytes, PROT_READ, MAP_SHARED | MAP_POPULATE, local, 0);
    if (p == MAP_FAILED) {
      Status s = Errno("mmap " + path);
      close(local);
      return s;
    }
  }
  close(local);  // the mapping keeps the memory alive
  out->reset(new SharedMapping(static_cast<uint8_t*>(p), nbytes, -1));
  return Status::Ok();
}

}  // namespace rlboost
