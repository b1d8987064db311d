#include "common/listen_backlog.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

namespace tandem {

void WidenListenBacklog(int port) {
  std::vector<int> fds;
  try {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const std::string name = entry.path().filename().string();
      if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) {
        fds.push_back(std::stoi(name));
      }
    }
  } catch (const std::exception&) {
    return;  // no /proc: keep httplib's backlog
  }
  for (int fd : fds) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6)
      bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound == port) ::listen(fd, SOMAXCONN);
  }
}

}  // namespace tandem
