// The peer's socket inode from the kernel's socket diagnostics (one exact lookup over
// netlink; /proc/net/tcp{,6} where netlink is unavailable), then that inode among the
// process's fds. The lookup costs the same however many sockets the host has open: the
// table in /proc grows with every connection, a flood's included, and reading it made each
// loopback login under "auto" wait on all of them.
#include "channel/peer_process.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
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

// The same inode by an exact sock_diag lookup of the socket with local address `local`
// and remote address `remote`; "" when the kernel answers nothing (or no netlink here).
std::string DiagInodeOf(const sockaddr_storage& local, const sockaddr_storage& remote) {
  struct {
    nlmsghdr head;
    inet_diag_req_v2 req;
  } msg{};
  msg.head.nlmsg_len = sizeof(msg);
  msg.head.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.head.nlmsg_flags = NLM_F_REQUEST;
  msg.req.sdiag_family = static_cast<uint8_t>(local.ss_family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (local.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(local);
    const auto& r = reinterpret_cast<const sockaddr_in&>(remote);
    msg.req.id.idiag_sport = l.sin_port;
    msg.req.id.idiag_dport = r.sin_port;
    std::memcpy(msg.req.id.idiag_src, &l.sin_addr, 4);
    std::memcpy(msg.req.id.idiag_dst, &r.sin_addr, 4);
  } else {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local);
    const auto& r = reinterpret_cast<const sockaddr_in6&>(remote);
    msg.req.id.idiag_sport = l.sin6_port;
    msg.req.id.idiag_dport = r.sin6_port;
    std::memcpy(msg.req.id.idiag_src, &l.sin6_addr, 16);
    std::memcpy(msg.req.id.idiag_dst, &r.sin6_addr, 16);
  }
  const int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return "";
  alignas(nlmsghdr) char reply[1024];
  ssize_t n = -1;
  if (send(nl, &msg, sizeof(msg), 0) == static_cast<ssize_t>(sizeof(msg))) n = recv(nl, reply, sizeof(reply), 0);
  close(nl);
  const auto* head = reinterpret_cast<const nlmsghdr*>(reply);
  if (n < 0 || !NLMSG_OK(head, static_cast<size_t>(n)) || head->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      head->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return "";
  }
  const auto* found = static_cast<const inet_diag_msg*>(NLMSG_DATA(head));
  return "socket:[" + std::to_string(found->idiag_inode) + "]";
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
  std::string inode = DiagInodeOf(peer, self);
  if (inode.empty()) {
    const char* table = self.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6";
    inode = InodeOf(table, ProcAddress(peer), ProcAddress(self));
  }
  return !inode.empty() && ProcessHolds(pid, inode);
}

}  // namespace rlboost
