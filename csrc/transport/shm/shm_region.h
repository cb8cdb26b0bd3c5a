// Shared-memory regions: anonymous memfd files, so a same-host puller can map a
// server's published bytes directly and nothing is left behind in /dev/shm when the
// process exits (the memory goes away with its last mapping and descriptor).
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace rlboost {

class SharedMapping {
 public:
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  // A new zero-filled, writable region of nbytes (pages populated up front, because
  // first-touch faults would otherwise dominate the first write).
  static Status Create(uint64_t nbytes, std::unique_ptr<SharedMapping>* out);
  // Maps another process's region read-only through /proc/<pid>/fd/<fd>, which must name
  // a memfd (or regular file) of at least nbytes sealed against shrinking; anything else
  // (a FIFO, a device, a socket) is refused without being opened for reading (kProtocol),
  // so no announcement can block the puller. Mappings are
  // shared per memfd while in use and kept a few seconds after their last use (a
  // publisher reuses its regions across versions, and a fresh mapping pays page faults on
  // the first copy); an idle mapping is dropped as soon as the source retires the region,
  // so it never keeps freed memory alive for long.
  static Status OpenRemote(uint32_t pid, int fd, uint64_t nbytes, std::shared_ptr<SharedMapping>* out);

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }  // -1 for a remote mapping

 private:
  SharedMapping(uint8_t* data, uint64_t size, int fd) : data_(data), size_(size), fd_(fd) {}
  uint8_t* data_;
  uint64_t size_;
  int fd_;
};

}  // namespace rlboost
