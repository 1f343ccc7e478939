#include "ral/compiled_code.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

namespace blade::ral {
namespace {

// Closes a file descriptor on every path out of the loader.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
};

}  // namespace

CompiledCode::CompiledCode(const uint8_t* data, size_t size, const std::string& name) {
  fd_ = ::memfd_create(("blade:" + name).c_str(), MFD_CLOEXEC);
  TORCH_CHECK(fd_ >= 0, "blade: engine '", name, "': memfd_create failed: ", std::strerror(errno));
  // The memory file stays open while the code is loaded: the loader identifies libraries
  // by path, and a reused descriptor number would make it hand back another engine's code.
  FdCloser closer{fd_};
  const int fd = fd_;
  size_t written = 0;
  while (written < size) {
    ssize_t n = ::write(fd, data + written, size - written);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    TORCH_CHECK(n > 0, "blade: engine '", name, "': writing code to memory failed: ",
                std::strerror(errno));
    written += static_cast<size_t>(n);
  }
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  // RTLD_LOCAL: the engine's symbols never clash with another engine's.
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  const char* load_error = handle_ ? nullptr : ::dlerror();
  TORCH_CHECK(handle_ != nullptr, "blade: engine '", name,
              "': its compiled code could not be loaded: ", load_error ? load_error : "unknown");
  entry_ = reinterpret_cast<EntryFn>(::dlsym(handle_, kEntrySymbol));
  if (entry_ == nullptr) {
    ::dlclose(handle_);
    handle_ = nullptr;
    TORCH_CHECK(false, "blade: engine '", name, "': compiled code has no '", kEntrySymbol,
                "' symbol");
  }
  if (auto table = reinterpret_cast<KernelCallsFn>(::dlsym(handle_, kKernelCallsSymbol))) {
    std::string error;
    try {
      kernel_calls_ = std::make_unique<KernelCallTable>(table());
    } catch (const c10::Error& e) {
      error = e.msg();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty()) {
      ::dlclose(handle_);
      handle_ = nullptr;
      TORCH_CHECK(false, "blade: engine '", name, "': its kernel calls: ", error);
    }
  }
  if (auto list = reinterpret_cast<WeightArgumentsFn>(::dlsym(handle_, kWeightArgumentsSymbol))) {
    std::istringstream words(list());
    std::string word;
    while (words >> word) {
      const bool digits = word.size() <= 9 &&
          word.find_first_not_of("0123456789") == std::string::npos;
      const size_t index = digits ? std::stoul(word) : 0;
      if (!digits || (!weight_arguments_.empty() && index <= weight_arguments_.back())) {
        ::dlclose(handle_);
        handle_ = nullptr;
        TORCH_CHECK(false, "blade: engine '", name, "': its weight arguments '",
                    std::string(list()).substr(0, 80), "' are not ascending indices");
      }
      weight_arguments_.push_back(index);
    }
  }
  closer.fd = -1;  // loaded: the descriptor now lives as long as this object
}

std::shared_ptr<CompiledCode> CompiledCode::load_shared(const uint8_t* data, size_t size,
                                                       const Digest& digest,
                                                       const std::string& name) {
  static std::mutex mutex;
  static auto* loaded = new std::map<Digest, std::weak_ptr<CompiledCode>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto existing = (*loaded)[digest].lock()) {
    return existing;
  }
  // Entries of unloaded code are dropped as new code loads, so the map stays small.
  for (auto it = loaded->begin(); it != loaded->end();) {
    it = it->second.expired() ? loaded->erase(it) : std::next(it);
  }
  auto code = std::make_shared<CompiledCode>(data, size, name);
  (*loaded)[digest] = code;
  return code;
}

CompiledCode::~CompiledCode() {
  if (handle_ != nullptr) {
    ::dlclose(handle_);
  }
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

}  // namespace blade::ral
