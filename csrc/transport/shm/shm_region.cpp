// memfd-backed regions and read-only mappings of another process's region.
#include "transport/shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
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
  int fd = memfd_create("rlboost-weights", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(nbytes)) != 0) {
    Status s = Errno("ftruncate(" + std::to_string(nbytes) + ")");
    close(fd);
    return s;
  }
  // Sealed at its size: a puller that maps it can rely on every page staying there (a
  // region that could shrink would fault its reads), and checks the seal (OpenRemote).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = Errno("sealing the shared region");
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

using Clock = std::chrono::steady_clock;

// How long a mapping nobody uses stays mapped in case the same region is pulled again
// (back-to-back pulls, a publisher reusing its regions), how many such idle bytes may be
// kept, and how often idle mappings are checked against their source: one the source has
// retired (closed its descriptor, or exited) is dropped within that interval, since only
// this mapping would then be keeping its memory alive.
constexpr auto kIdleKeep = std::chrono::seconds(5);
constexpr auto kRetiredPoll = std::chrono::milliseconds(200);
constexpr uint64_t kMaxIdleBytes = uint64_t{1} << 30;

// Read-only mappings of other processes' regions, keyed by the memfd's identity and
// shared by every stream that reads the region. A mapping in use is never dropped; an
// idle one goes when kIdleKeep passes without reuse, when its source retires the region,
// or when the idle bytes exceed kMaxIdleBytes (oldest first, never the newest). A reaper thread runs only
// while idle mappings exist.
class RemoteMappingCache {
 public:
  static RemoteMappingCache& Get() {
    static RemoteMappingCache* cache = [] {
      auto* c = new RemoteMappingCache();  // never destroyed: safe at exit
      pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); }, [] { Get().AfterForkInChild(); });
      return c;
    }();
    return *cache;
  }

  // A shared use of a cached mapping of (dev, ino) at least nbytes long, or nullptr.
  std::shared_ptr<SharedMapping> Acquire(dev_t dev, ino_t ino, uint64_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : entries_) {
      if (e.dev == dev && e.ino == ino && e.mapping->size() >= nbytes) return UseLocked(e);
    }
    return nullptr;
  }

  std::shared_ptr<SharedMapping> Insert(uint32_t pid, int fd, dev_t dev, ino_t ino,
                                        std::shared_ptr<SharedMapping> m) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(Entry{pid, fd, dev, ino, std::move(m), 0, Clock::now()});
    std::shared_ptr<SharedMapping> use = UseLocked(entries_.back());  // in use: never pruned
    PruneLocked(Clock::now());
    return use;
  }

 private:
  struct Entry {
    uint32_t pid;
    int fd;
    dev_t dev;
    ino_t ino;
    std::shared_ptr<SharedMapping> mapping;
    int users;
    Clock::time_point idle_since;
  };

  // The returned pointer aliases the mapping; dropping its last copy ends this use.
  std::shared_ptr<SharedMapping> UseLocked(Entry& e) {
    ++e.users;
    return std::shared_ptr<SharedMapping>(e.mapping.get(), [this, keep = e.mapping](SharedMapping*) {
      Release(keep.get());
    });
  }

  void Release(const SharedMapping* m) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : entries_) {
      if (e.mapping.get() == m && --e.users == 0) e.idle_since = Clock::now();
    }
    PruneLocked(Clock::now());
    if (!reaper_running_ && HasIdleLocked()) {
      reaper_running_ = true;
      std::thread([this] { Reap(); }).detach();
    }
  }

  bool HasIdleLocked() const {
    return std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.users == 0; });
  }

  // Whether the source no longer holds this region at the descriptor it announced.
  static bool Retired(const Entry& e) {
    std::string path = "/proc/" + std::to_string(e.pid) + "/fd/" + std::to_string(e.fd);
    struct stat st;
    return stat(path.c_str(), &st) != 0 || st.st_dev != e.dev || st.st_ino != e.ino;
  }

  void PruneLocked(Clock::time_point now) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
                     return e.users == 0 && (now - e.idle_since >= kIdleKeep || Retired(e));
                   }), entries_.end());
    uint64_t idle_bytes = 0;
    size_t idle = 0;
    for (const auto& e : entries_) {
      idle_bytes += e.users == 0 ? e.mapping->size() : 0;
      idle += e.users == 0 ? 1 : 0;
    }
    // The newest idle mapping stays whatever its size: remapping a region larger than the
    // bound on every pull would fault in its page tables each time (a 2 GiB pull ran at
    // half speed); the idle timeout and the retirement check still drop it.
    for (; idle_bytes > kMaxIdleBytes && idle > 1; --idle) {
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->users == 0 && (oldest == entries_.end() || it->idle_since < oldest->idle_since)) oldest = it;
      }
      idle_bytes -= oldest->mapping->size();
      entries_.erase(oldest);
    }
  }

  void Reap() {
    std::unique_lock<std::mutex> lock(mu_);
    while (HasIdleLocked()) {
      wake_.wait_for(lock, kRetiredPoll);
      PruneLocked(Clock::now());
    }
    reaper_running_ = false;
  }

  // The reaper does not exist in a forked child: let the next idle mapping start one.
  void AfterForkInChild() {
    new (&wake_) std::condition_variable();
    reaper_running_ = false;
    mu_.unlock();
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Entry> entries_;
  bool reaper_running_ = false;
};

// Opens the source's descriptor without blocking and without side effects whatever it
// names (O_PATH: a FIFO or a device is never opened for reading), checks that it is a
// sealed memfd of at least nbytes, and only then opens it for reading through this
// process's own descriptor of the same file, so nothing can be swapped in between.
Status OpenRegionFile(const std::string& path, uint64_t nbytes, int* out, struct stat* st) {
  int pathfd = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (pathfd < 0) return Errno("open " + path);
  if (fstat(pathfd, st) != 0 || !S_ISREG(st->st_mode)) {
    close(pathfd);
    return Status(Code::kProtocol, "the shared region the source named is not a memory file");
  }
  std::string self = "/proc/self/fd/" + std::to_string(pathfd);
  int fd = open(self.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  close(pathfd);
  if (fd < 0) return Errno("open " + path);
  struct stat again;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &again) != 0 || again.st_ino != st->st_ino || again.st_dev != st->st_dev ||
      static_cast<uint64_t>(again.st_size) < nbytes) {
    close(fd);
    return Status(Code::kProtocol, "shared region is smaller than announced");
  }
  // A region that could shrink under our mapping would fault (SIGBUS) on the next read.
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    close(fd);
    return Status(Code::kProtocol, "the shared region is not sealed against shrinking");
  }
  *st = again;
  *out = fd;
  return Status::Ok();
}

}  // namespace

Status SharedMapping::OpenRemote(uint32_t pid, int fd, uint64_t nbytes,
                                 std::shared_ptr<SharedMapping>* out) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = -1;
  struct stat st;
  RLB_RETURN_IF_ERROR(OpenRegionFile(path, nbytes, &local, &st));
  *out = RemoteMappingCache::Get().Acquire(st.st_dev, st.st_ino, nbytes);
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
  std::shared_ptr<SharedMapping> mapping(new SharedMapping(static_cast<uint8_t*>(p), size, -1));
  *out = RemoteMappingCache::Get().Insert(pid, fd, st.st_dev, st.st_ino, std::move(mapping));
  return Status::Ok();
}

}  // namespace rlboost
