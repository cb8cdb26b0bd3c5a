// memfd-backed regions and read-only mappings of another process's region.
#include "transport/shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

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

namespace {

// A few recent read-only mappings of other processes' regions, keyed by the memfd's
// identity. Bounded, and entries of exited processes are dropped, so at most a few old
// regions are kept alive by this cache.
class RemoteMappingCache {
 public:
  static RemoteMappingCache& Get() {
    static RemoteMappingCache* cache = new RemoteMappingCache();  // never destroyed: safe at exit
    return *cache;
  }

  std::shared_ptr<SharedMapping> Find(dev_t dev, ino_t ino, uint64_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : entries_) {
      if (e.dev == dev && e.ino == ino && e.mapping->size() >= nbytes) {
        e.last_use = ++tick_;
        return e.mapping;
      }
    }
    return nullptr;
  }

  void Put(uint32_t pid, dev_t dev, ino_t ino, std::shared_ptr<SharedMapping> m) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(Entry{pid, dev, ino, std::move(m), ++tick_});
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [](const Entry& e) { return kill(static_cast<pid_t>(e.pid), 0) != 0 && errno == ESRCH; }),
                   entries_.end());
    while (entries_.size() > kMaxEntries) {
      auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                     [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
      entries_.erase(oldest);
    }
  }

 private:
  static constexpr size_t kMaxEntries = 4;
  struct Entry {
    uint32_t pid;
    dev_t dev;
    ino_t ino;
    std::shared_ptr<SharedMapping> mapping;
    uint64_t last_use;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
  uint64_t tick_ = 0;
};

}  // namespace

Status SharedMapping::OpenRemote(uint32_t pid, int fd, uint64_t nbytes,
                                 std::shared_ptr<SharedMapping>* out) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (local < 0) return Errno("open " + path);
  struct stat st;
  if (fstat(local, &st) != 0 || static_cast<uint64_t>(st.st_size) < nbytes) {
    close(local);
    return Status(Code::kProtocol, "shared region is smaller than announced");
  }
  *out = RemoteMappingCache::Get().Find(st.st_dev, st.st_ino, nbytes);
  if (*out != nullptr) {
    close(local);
    return Status::Ok();
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  void* p = nullptr;
  if (size > 0) {
    p = mmap(nullptr, size, PROT_READ, MAP_SHARED, local, 0);
    if (p == MAP_FAILED) {
      Status s = Errno("mmap " + path);
      close(local);
      return s;
    }
  }
  close(local);  // the mapping keeps the memory alive
  out->reset(new SharedMapping(static_cast<uint8_t*>(p), size, -1));
  RemoteMappingCache::Get().Put(pid, st.st_dev, st.st_ino, *out);
  return Status::Ok();
}

}  // namespace rlboost
