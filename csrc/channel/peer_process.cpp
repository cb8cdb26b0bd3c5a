// The peer's socket inode from /proc/net/tcp{,6}, then that inode among the process's fds.
#include "channel/peer_process.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace rlboost {
namespace {

// An address as /proc/net/tcp{,6} prints it: the raw 32-bit words in hex, then the port.
std::string ProcAddress(const sockaddr_storage& ss) {
  char out[64];
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    std::snprintf(out, sizeof(out), "%08X:%04X", a.sin_addr.s_addr, ntohs(a.sin_port));
    return out;
  }
  const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
  uint32_t w[4];
  std::memcpy(w, &a.sin6_addr, sizeof(w));
  std::snprintf(out, sizeof(out), "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3], ntohs(a.sin6_port));
  return out;
}

// The inode of the socket whose local address is `local` and remote address `remote`.
std::string InodeOf(const char* table, const std::string& local, const std::string& remote) {
  std::ifstream f(table);
  std::string line;
  std::getline(f, line);  // the heading
  while (std::getline(f, line)) {
    char sl[16], loc[64], rem[64], st[8], queues[40], timer[40], retr[16];
    unsigned long uid = 0, timeout = 0, inode = 0;
    if (std::sscanf(line.c_str(), "%15s %63s %63s %7s %39s %39s %15s %lu %lu %lu", sl, loc, rem, st, queues, timer,
                    retr, &uid, &timeout, &inode) != 10) {
      continue;
    }
    if (local == loc && remote == rem) return "socket:[" + std::to_string(inode) + "]";
  }
  return "";
}

bool ProcessHolds(uint32_t pid, const std::string& link) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  char target[64];
  while (!found) {
    dirent* e = readdir(d);
    if (e == nullptr) break;
    if (e->d_name[0] == '.') continue;
    const std::string path = dir + "/" + e->d_name;
    ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    found = n > 0 && link.compare(0, std::string::npos, target, static_cast<size_t>(n)) == 0;
  }
  closedir(d);
  return found;
}

}  // namespace

bool PeerSocketHeldBy(int fd, uint32_t pid) {
  sockaddr_storage self{}, peer{};
  socklen_t a = sizeof(self), b = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &a) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0 || self.ss_family != peer.ss_family) {
    return false;
  }
  // The peer's socket is the one whose local address is our remote one, and back.
  const char* table = self.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6";
  const std::string inode = InodeOf(table, ProcAddress(peer), ProcAddress(self));
  return !inode.empty() && ProcessHolds(pid, inode);
}

}  // namespace rlboost
