#include "ral/signing.h"

#include "ral/engine.h"
#include "ral/slow_path.h"
#include "ral/tensor_spec.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

namespace blade::ral {
namespace {

constexpr size_t kPublicKeyBytes = 32;
constexpr size_t kSignatureBytes = 64;
constexpr size_t kHashChunk = size_t{4} << 20;

struct PkeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// The newest OpenSSL error, for messages (the queue is cleared).
std::string openssl_error() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) {
    return "no detail from OpenSSL";
  }
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

std::string lower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return text;
}

std::string public_key_hex(EVP_PKEY* key) {
  uint8_t raw[kPublicKeyBytes];
  size_t size = sizeof(raw);
  TORCH_CHECK(EVP_PKEY_get_raw_public_key(key, raw, &size) == 1 && size == kPublicKeyBytes,
              "blade: the signing key is not an Ed25519 key: ", openssl_error());
  return to_hex(raw, size);
}

Pkey read_private_key(const std::string& path) {
  File file(std::fopen(path.c_str(), "rb"));
  TORCH_CHECK(file, "blade: cannot read the engine signing key '", path,
              "': ", std::strerror(errno));
  Pkey key(PEM_read_PrivateKey(file.get(), nullptr, nullptr, nullptr));
  TORCH_CHECK(key, "blade: '", path, "' is not a PEM private key: ", openssl_error());
  TORCH_CHECK(EVP_PKEY_is_a(key.get(), "ED25519"), "blade: the engine signing key '", path,
              "' is not an Ed25519 key; make one with `openssl genpkey -algorithm ed25519`");
  return key;
}

void make_directories(const std::string& dir) {
  for (size_t at = 1; at != std::string::npos;) {
    at = dir.find('/', at + 1);
    std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      TORCH_CHECK(false, "blade: cannot create '", part, "' for the engine signing key: ",
                  std::strerror(errno));
    }
  }
}

// Writes a new key to `path` unless one is there. Safe against a concurrent first use in
// another process: the key is written to a private temporary file and linked into place,
// which fails if the other process linked its key first; then both use the one linked.
void create_private_key(const std::string& path) {
  make_directories(path.substr(0, path.rfind('/')));
  Pkey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  TORCH_CHECK(key, "blade: cannot generate an engine signing key: ", openssl_error());
  std::random_device random;
  std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(random());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  TORCH_CHECK(fd >= 0, "blade: cannot create the engine signing key '", temporary,
              "': ", std::strerror(errno));
  File file(::fdopen(fd, "wb"));
  if (!file) {
    ::close(fd);
  }
  bool written = file && PEM_write_PrivateKey(file.get(), key.get(), nullptr, nullptr, 0,
                                              nullptr, nullptr) == 1 &&
                 std::fflush(file.get()) == 0 && ::fsync(fileno(file.get())) == 0;
  file.reset();
  int linked = written ? ::link(temporary.c_str(), path.c_str()) : -1;
  int link_errno = errno;
  ::unlink(temporary.c_str());
  TORCH_CHECK(written, "blade: cannot write the engine signing key '", temporary, "'");
  TORCH_CHECK(linked == 0 || link_errno == EEXIST, "blade: cannot create the engine signing "
              "key '", path, "': ", std::strerror(link_errno));
}

bool file_exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// The key at `path`, or this machine's key (created on first use) when `path` is empty.
Pkey signing_key(const std::string& path) {
  if (!path.empty()) {
    return read_private_key(path);
  }
  const std::string local = default_signing_key_path();
  if (!file_exists(local)) {
    create_private_key(local);
  }
  return read_private_key(local);
}

class TrustStore {
 public:
  void add(const std::string& hex) {
    std::lock_guard<std::mutex> lock(mutex_);
    initialize_locked();
    keys_.insert(hex);
  }

  bool contains(const std::string& hex) {
    std::lock_guard<std::mutex> lock(mutex_);
    initialize_locked();
    return keys_.count(hex) != 0;
  }

  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> lock(mutex_);
    initialize_locked();
    return {keys_.begin(), keys_.end()};
  }

 private:
  // The local key and BLADE_TRUSTED_KEYS, once. A malformed entry is reported, not fatal:
  // engines it would have admitted fall back, and say which key they need.
  void initialize_locked() {
    if (initialized_) {
      return;
    }
    initialized_ = true;
    std::string local = default_signing_key_path();
    if (file_exists(local)) {
      try {
        keys_.insert(public_key_hex(read_private_key(local).get()));
      } catch (const c10::Error& e) {
        TORCH_WARN("blade: this machine's engine signing key is unusable, so engines it "
                   "signed are not trusted: ", e.what_without_backtrace());
      }
    }
    const char* listed = std::getenv(kTrustedKeysVariable);
    std::istringstream entries(listed ? listed : "");
    std::string entry;
    while (std::getline(entries, entry, ',')) {
      entry.erase(0, entry.find_first_not_of(" \t\n"));
      entry.erase(entry.find_last_not_of(" \t\n") + 1);
      if (entry.empty()) {
        continue;
      }
      std::string hex = entry;
      std::vector<uint8_t> raw;
      if (!parse_hex(hex, kPublicKeyBytes, &raw)) {
        std::ifstream file(entry);
        hex.clear();
        file >> hex;
      }
      if (parse_hex(hex, kPublicKeyBytes, &raw)) {
        keys_.insert(lower(hex));
      } else {
        TORCH_WARN("blade: ", kTrustedKeysVariable, " lists '", entry, "', which is neither a "
                   "public key (64 hex digits) nor a readable file holding one; ignored");
      }
    }
  }

  std::mutex mutex_;
  bool initialized_ = false;
  std::set<std::string> keys_;
};

TrustStore& trust_store() {
  static TrustStore* store = new TrustStore();  // never destroyed: used until exit
  return *store;
}

Digest sha256(const uint8_t* data, size_t size) {
  Digest out{};
  unsigned int length = 0;
  TORCH_CHECK(EVP_Digest(data, size, out.data(), &length, EVP_sha256(), nullptr) == 1 &&
                  length == out.size(),
              "blade: SHA-256 failed: ", openssl_error());
  return out;
}

}  // namespace

bool parse_hex(const std::string& hex, size_t bytes, std::vector<uint8_t>* out) {
  if (hex.size() != 2 * bytes) {
    return false;
  }
  out->resize(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    int value = 0;
    for (size_t k = 0; k < 2; ++k) {
      char c = hex[2 * i + k];
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
      if (digit < 0) {
        return false;
      }
      value = value * 16 + digit;
    }
    (*out)[i] = static_cast<uint8_t>(value);
  }
  return true;
}

FieldHasher::FieldHasher() : ctx_(EVP_MD_CTX_new()) {
  auto* ctx = static_cast<EVP_MD_CTX*>(ctx_);
  TORCH_CHECK(ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1,
              "blade: SHA-256 is unavailable: ", openssl_error());
}

FieldHasher::~FieldHasher() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

void FieldHasher::add(const void* data, size_t size) {
  uint64_t length = size;
  auto* ctx = static_cast<EVP_MD_CTX*>(ctx_);
  TORCH_CHECK(EVP_DigestUpdate(ctx, &length, sizeof(length)) == 1 &&
                  EVP_DigestUpdate(ctx, data, size) == 1,
              "blade: SHA-256 failed: ", openssl_error());
}

void FieldHasher::add(int64_t value) {
  add(&value, sizeof(value));
}

Digest FieldHasher::finish() {
  Digest out{};
  unsigned int length = 0;
  TORCH_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &length) == 1 &&
                  length == out.size(),
              "blade: SHA-256 failed: ", openssl_error());
  return out;
}

Digest chunked_sha256(const uint8_t* data, size_t size) {
  const size_t chunks = size == 0 ? 1 : (size + kHashChunk - 1) / kHashChunk;
  std::vector<Digest> digests(chunks);
  at::parallel_for(0, static_cast<int64_t>(chunks), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      size_t at = static_cast<size_t>(c) * kHashChunk;
      digests[c] = sha256(data + at, std::min(kHashChunk, size - at));
    }
  });
  return sha256(digests[0].data(), digests.size() * sizeof(Digest));
}

std::string to_hex(const uint8_t* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = digits[data[i] >> 4];
    out[2 * i + 1] = digits[data[i] & 15];
  }
  return out;
}

std::string default_signing_key_path() {
  std::string base;
  if (const char* config = std::getenv("XDG_CONFIG_HOME"); config && config[0] == '/') {
    base = config;
  } else {
    const char* home = std::getenv("HOME");
    if ((home == nullptr || home[0] != '/') && ::getpwuid(::getuid()) != nullptr) {
      home = ::getpwuid(::getuid())->pw_dir;
    }
    TORCH_CHECK(home != nullptr && home[0] == '/', "blade: no home directory to keep the "
                "engine signing key in; set XDG_CONFIG_HOME or Config(signing_key=...)");
    base = std::string(home) + "/.config";
  }
  return base + "/blade/engine_signing_key.pem";
}

std::string signing_public_key(const std::string& path) {
  return public_key_hex(signing_key(path).get());
}

std::string sign_digest(const Digest& digest, const std::string& path) {
  const std::string where = path.empty() ? default_signing_key_path() : path;
  Pkey key = signing_key(path);
  MdCtx ctx(EVP_MD_CTX_new());
  uint8_t signature[kSignatureBytes];
  size_t size = sizeof(signature);
  TORCH_CHECK(ctx && EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
                  EVP_DigestSign(ctx.get(), signature, &size, digest.data(), digest.size()) == 1 &&
                  size == kSignatureBytes,
              "blade: signing an engine with '", where, "' failed: ", openssl_error());
  std::string public_key = public_key_hex(key.get());
  trust_store().add(public_key);
  return std::string(kSignatureScheme) + ":" + public_key + ":" + to_hex(signature, size);
}

namespace {
std::atomic<uint64_t> trusted_keys_version{0};
std::atomic<bool> python_host{false};
}  // namespace

void trust_public_key(const std::string& hex) {
  std::vector<uint8_t> raw;
  TORCH_CHECK(parse_hex(hex, kPublicKeyBytes, &raw), "blade: a trusted key must be an Ed25519 "
              "public key written as 64 hex digits (as `python -m blade key` prints it), got '",
              hex.substr(0, 80), "'");
  trust_store().add(lower(hex));
  trusted_keys_version.fetch_add(1);
}

uint64_t trust_version() {
  return trusted_keys_version.load();
}

void set_python_host() {
  python_host.store(true);
}

std::string trust_advice(const std::string& key) {
  if (python_host.load()) {
    return "if you trust who compiled this model, call blade.trust_key(\"" + key +
           "\") (its engines load their code on their next call) or set " +
           kTrustedKeysVariable + "=" + key + " in the environment";
  }
  return "if you trust who compiled this model, call blade::ral::trust_public_key(\"" + key +
         "\") (its engines load their code on their next call) or set " +
         kTrustedKeysVariable + "=" + key + " in the service's environment";
}

std::vector<std::string> trusted_public_keys() {
  return trust_store().keys();
}

std::string verify_digest(const Digest& digest, const std::string& signature,
                          std::string* untrusted_key) {
  if (signature.empty()) {
    return "the engine is not signed";
  }
  const std::string prefix = std::string(kSignatureScheme) + ":";
  std::vector<uint8_t> key_bytes;
  std::vector<uint8_t> signature_bytes;
  const size_t split = prefix.size() + 2 * kPublicKeyBytes;
  if (signature.rfind(prefix, 0) != 0 || signature.size() != split + 1 + 2 * kSignatureBytes ||
      signature[split] != ':' ||
      !parse_hex(signature.substr(prefix.size(), 2 * kPublicKeyBytes), kPublicKeyBytes,
                 &key_bytes) ||
      !parse_hex(signature.substr(split + 1), kSignatureBytes, &signature_bytes)) {
    return "the engine's signature is malformed (expected " + prefix +
           "<64 hex digits>:<128 hex digits>)";
  }
  std::string key_hex = to_hex(key_bytes.data(), key_bytes.size());
  if (!trust_store().contains(key_hex)) {
    if (untrusted_key != nullptr) {
      *untrusted_key = key_hex;
    }
    return "the engine is signed by key " + key_hex + ", which this process does not trust";
  }
  Pkey key(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, key_bytes.data(),
                                       key_bytes.size()));
  MdCtx ctx(EVP_MD_CTX_new());
  const bool valid =
      key && ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
      EVP_DigestVerify(ctx.get(), signature_bytes.data(), signature_bytes.size(), digest.data(),
                       digest.size()) == 1;
  ERR_clear_error();
  if (!valid) {
    return "the engine's signature does not match its contents (code, signature, params or "
           "metadata were changed after signing)";
  }
  return "";
}

// Engines (engine.h): what an engine's signature covers, and signing one.

namespace {

Digest engine_digest(const std::string& name, FallbackMode mode, const std::string& fallback_ir,
                     const std::vector<TensorSpec>& input_specs,
                     const std::vector<TensorSpec>& output_specs,
                     const std::string& cpu_features, const std::string& precision,
                     const std::string& writes, const std::vector<at::Tensor>& params,
                     const Digest& code) {
  FieldHasher hasher;
  hasher.add(std::string("blade engine"));
  hasher.add(kEngineFormatVersion);
  hasher.add(name);
  hasher.add(std::string(mode == FallbackMode::kError ? "error" : "fallback"));
  hasher.add(fallback_ir);
  hasher.add(format_specs(input_specs));
  hasher.add(format_specs(output_specs));
  hasher.add(cpu_features);
  if (precision != "float32") {  // engines from before the field keep their digest
    hasher.add(std::string("precision=") + precision);
  }
  if (!writes.empty()) {  // likewise
    hasher.add(std::string("writes=") + writes);
  }
  hasher.add(static_cast<int64_t>(params.size()));
  for (const auto& param : params) {
    at::Tensor p = param.contiguous();
    hasher.add(std::string(dtype_name(p.scalar_type())));
    hasher.add(p.dim());
    for (int64_t size : p.sizes()) {
      hasher.add(size);
    }
    Digest bytes = chunked_sha256(static_cast<const uint8_t*>(p.data_ptr()), p.nbytes());
    hasher.add(bytes.data(), bytes.size());
  }
  hasher.add(code.data(), code.size());
  return hasher.finish();
}

}  // namespace

Digest code_digest(const at::Tensor& code) {
  at::Tensor bytes = code.contiguous();
  return chunked_sha256(bytes.data_ptr<uint8_t>(), static_cast<size_t>(bytes.numel()));
}

Digest Engine::signed_digest(const Digest& code) const {
  return engine_digest(name_, fallback_mode_, fallback_ir_, input_specs_, output_specs_,
                       cpu_features_, precision_, writes(), params_, code);
}

Digest digest_to_sign(const std::string& name, const at::Tensor& code,
                      const std::string& input_specs, const std::string& output_specs,
                      const std::string& fallback_ir, const std::vector<at::Tensor>& params,
                      const std::string& fallback_mode, const std::string& cpu_features,
                      const std::string& precision, const std::string& writes) {
  TORCH_CHECK(code.scalar_type() == at::kByte && code.dim() == 1,
              "blade: engine code to sign must be a 1-D uint8 tensor");
  return engine_digest(name, parse_fallback_mode(fallback_mode), fallback_ir,
                       parse_specs(input_specs), parse_specs(output_specs), cpu_features,
                       precision, writes, params, code_digest(code));
}

std::string sign_engine(const std::string& name, const at::Tensor& code,
                        const std::string& input_specs, const std::string& output_specs,
                        const std::string& fallback_ir, const std::vector<at::Tensor>& params,
                        const std::string& fallback_mode, const std::string& cpu_features,
                        const std::string& key_path, const std::string& precision,
                        const std::string& writes) {
  return sign_digest(digest_to_sign(name, code, input_specs, output_specs, fallback_ir, params,
                                    fallback_mode, cpu_features, precision, writes),
                     key_path);
}

void warn_untrusted_once(const std::string& key, const std::string& engine) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(key).second) {
      return;
    }
  }
  warn_user("blade: engine '" + engine + "' (and any other signed by the same key) is signed "
            "by key " + key + ", which this process does not trust: its compiled code is not "
            "loaded and its TorchScript subgraph runs instead (slower); " + trust_advice(key) +
            ".");
}

}  // namespace blade::ral

// For Blade's Python module, through ctypes, once it has loaded the runtime.
extern "C" __attribute__((visibility("default"))) void blade_ral_set_python_host() {
  blade::ral::set_python_host();
}
