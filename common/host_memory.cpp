#include "common/host_memory.hpp"

#include "common/error.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace proxyep {
namespace {

constexpr const char* kPhase = "host_memory";
constexpr size_t kPage = 4096;

size_t round_to_page(size_t bytes) {
  return (bytes + kPage - 1) / kPage * kPage;
}

void* map_shared(int fd, size_t bytes) {
  void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  require(address != MAP_FAILED, kPhase, "mmap of {} bytes of fd {} failed: {}", bytes, fd,
          std::strerror(errno));
  return address;
}

}  // namespace

HostMemory HostMemory::heap(size_t bytes) {
  require(bytes > 0, kPhase, "host memory of 0 bytes");
  const size_t size = round_to_page(bytes);
  // Anonymous pages rather than a memset block: zero on first touch, so a staging area or slots a
  // call never reaches cost neither memory nor the time to clear them (at 128 ranks a rank's
  // staging area is tens of MiB, most of it idle).
  void* address = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  require(address != MAP_FAILED, kPhase, "mmap of {} anonymous bytes failed: {}", size,
          std::strerror(errno));
  return HostMemory(Kind::heap, address, size);
}

HostMemory HostMemory::memfd(size_t bytes, const std::string& name) {
  require(bytes > 0, kPhase, "host memory of 0 bytes");
  const size_t size = round_to_page(bytes);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  require(fd >= 0, kPhase, "memfd_create('{}') failed: {}", name, std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int error = errno;
    ::close(fd);
    fail(kPhase, "ftruncate of memfd '{}' to {} bytes failed: {}", name, size,
         std::strerror(error));
  }
  void* address = nullptr;
  try {
    address = map_shared(fd, size);
  } catch (...) {
    ::close(fd);
    throw;
  }
  HostMemory memory(Kind::memfd, address, size);
  memory.fd_ = fd;
  return memory;
}

HostMemory HostMemory::map_fd(int fd) {
  struct stat info {};
  require(::fstat(fd, &info) == 0, kPhase, "fstat of fd {} failed: {}", fd, std::strerror(errno));
  require(info.st_size > 0, kPhase, "fd {} is empty: not a shared memfd", fd);
  int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  require(own >= 0, kPhase, "dup of fd {} failed: {}", fd, std::strerror(errno));
  const auto size = static_cast<size_t>(info.st_size);
  void* address = nullptr;
  try {
    address = map_shared(own, size);
  } catch (...) {
    ::close(own);
    throw;
  }
  HostMemory memory(Kind::memfd, address, size);
  memory.fd_ = own;
  return memory;
}

HostMemory HostMemory::map_process_fd(uint64_t pid, uint64_t fd) {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  const int opened = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  require(opened >= 0, kPhase, "cannot open {}: {}", path, std::strerror(errno));
  try {
    HostMemory memory = map_fd(opened);
    ::close(opened);
    return memory;
  } catch (...) {
    ::close(opened);
    throw;
  }
}

HostMemory HostMemory::adopt(void* host, size_t size, void* device, Deleter release) {
  require(host != nullptr && size > 0, kPhase, "adopting {} bytes at {}: nothing to own", size,
          host);
  require(static_cast<bool>(release), kPhase, "adopting {} bytes at {} without a deleter", size,
          host);
  HostMemory memory(Kind::adopted, host, size);
  memory.device_ = device;
  memory.deleter_ = std::move(release);
  return memory;
}

HostMemory::~HostMemory() {
  release();
}

HostMemory::HostMemory(HostMemory&& other) noexcept
    : kind_(other.kind_),
      host_(std::exchange(other.host_, nullptr)),
      device_(std::exchange(other.device_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      deleter_(std::exchange(other.deleter_, nullptr)) {}

HostMemory& HostMemory::operator=(HostMemory&& other) noexcept {
  if (this != &other) {
    release();
    kind_ = other.kind_;
    host_ = std::exchange(other.host_, nullptr);
    device_ = std::exchange(other.device_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    deleter_ = std::exchange(other.deleter_, nullptr);
  }
  return *this;
}

void HostMemory::release() noexcept {
  if (host_ != nullptr) {
    switch (kind_) {
      case Kind::heap:
        ::munmap(host_, size_);
        break;
      case Kind::memfd:
        ::munmap(host_, size_);
        break;
      case Kind::adopted:
        if (deleter_) deleter_(host_);
        break;
    }
  }
  if (fd_ >= 0) ::close(fd_);
  host_ = nullptr;
  device_ = nullptr;
  size_ = 0;
  fd_ = -1;
  deleter_ = nullptr;
}

}  // namespace proxyep
