// Engine signing: who compiled an engine's native code, and whether this process trusts them.
//
// A saved model carries native code that the runtime maps into the process. Before any byte
// of it is mapped, the runtime checks an Ed25519 signature (OpenSSL's libcrypto) over the
// code and everything the runtime believes about it (see Engine's signed digest), made with
// a key this process trusts. The threat model and the key handling are in docs/security.md.
//
// Keys:
//  - Signing: a compiling machine signs with its local key, an Ed25519 private key in PEM
//    at `<config dir>/blade/engine_signing_key.pem` (<config dir> is $XDG_CONFIG_HOME, else
//    ~/.config), created on first use with mode 0600; or with a key file the caller names.
//  - Trust: a process trusts the public key of the local key when that file exists, every
//    key listed in the environment variable BLADE_TRUSTED_KEYS (read once, at first use:
//    comma-separated, each a 64-digit hex public key or the path of a file holding one),
//    every key given to `trust_public_key`, and every key it signed with itself.
// Nothing here is reachable from TorchScript: a model file cannot sign or trust anything.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace blade::ral {

constexpr const char* kTrustedKeysVariable = "BLADE_TRUSTED_KEYS";
// How a signature is written: "ed25519:<public key, 64 hex digits>:<signature, 128 hex>".
constexpr const char* kSignatureScheme = "ed25519";

using Digest = std::array<uint8_t, 32>;  // SHA-256

// SHA-256 over a sequence of length-prefixed fields, so that no two different sequences of
// fields hash alike ("ab","c" and "a","bc" differ).
class FieldHasher {
 public:
  FieldHasher();
  ~FieldHasher();
  FieldHasher(const FieldHasher&) = delete;
  FieldHasher& operator=(const FieldHasher&) = delete;

  void add(const void* data, size_t size);
  void add(const std::string& text) { add(text.data(), text.size()); }
  void add(int64_t value);
  Digest finish();

 private:
  void* ctx_;  // EVP_MD_CTX
};

// SHA-256 of `size` bytes, hashed in 4 MiB chunks on the intra-op threads: the digest of the
// chunks' digests (so a large weight costs its size over the threads, once).
Digest chunked_sha256(const uint8_t* data, size_t size);

std::string to_hex(const uint8_t* data, size_t size);
// Reads exactly `bytes` bytes written as 2 * `bytes` hex digits (either case) into `*out`;
// false when `hex` is anything else.
bool parse_hex(const std::string& hex, size_t bytes, std::vector<uint8_t>* out);

// The default location of this machine's signing key (see above).
std::string default_signing_key_path();
// The public key (hex) of the private key at `path` (the default key when empty), creating
// that key first if the file does not exist. Throws c10::Error naming the file on failure.
std::string signing_public_key(const std::string& path);
// "ed25519:<public key>:<signature>" of `digest` by the key at `path` (default when empty,
// created on first use). The key becomes trusted by this process.
std::string sign_digest(const Digest& digest, const std::string& path);

// Adds a public key (64 hex digits) to this process's trusted keys. Throws c10::Error on a
// malformed key. What a C++ service calls before torch::jit::load, as Python's
// blade.trust_key does.
void trust_public_key(const std::string& hex);
std::vector<std::string> trusted_public_keys();
// Changes each time a key is trusted: an engine loaded before its key was trusted compares
// it with the version it saw.
uint64_t trust_version();
// How to trust `key`, in the terms of the process: Python's blade.trust_key once Blade's
// Python module is loaded (set_python_host), else the C++ call and the variable.
std::string trust_advice(const std::string& key);
void set_python_host();

// Empty when `signature` is a well-formed signature of `digest` by a trusted key; otherwise
// why not, in a sentence (unsigned, malformed, untrusted key, or wrong signature).
// `untrusted_key` receives the key when the only problem is that it is not trusted.
std::string verify_digest(const Digest& digest, const std::string& signature,
                          std::string* untrusted_key);

// Engines (engine.h): an engine is signed over a digest of its code and of everything the
// runtime trusts about it (Engine::signed_digest, defined here too).

// The SHA-256 of an engine's code (a 1-D uint8 tensor), as that digest covers it.
Digest code_digest(const at::Tensor& code);

// The digest an engine of these fields (as Engine's constructor takes them) is signed over.
Digest digest_to_sign(const std::string& name, const at::Tensor& code,
                      const std::string& input_specs, const std::string& output_specs,
                      const std::string& fallback_ir, const std::vector<at::Tensor>& params,
                      const std::string& fallback_mode, const std::string& cpu_features,
                      const std::string& precision, const std::string& writes);

// The signature Engine's constructor verifies for these fields, made with the private key at
// `key_path` (this machine's key, created on first use, when empty; see above).
// Only the compiler calls this (blade._C); TorchScript cannot.
std::string sign_engine(const std::string& name, const at::Tensor& code,
                        const std::string& input_specs, const std::string& output_specs,
                        const std::string& fallback_ir, const std::vector<at::Tensor>& params,
                        const std::string& fallback_mode, const std::string& cpu_features,
                        const std::string& key_path, const std::string& precision,
                        const std::string& writes = "");

// Tells the user that `engine` (and any other signed by `key`) runs its subgraph because
// this process does not trust `key`, and how to trust it: once per key and process, so
// that a model of 40 engines says it once.
void warn_untrusted_once(const std::string& key, const std::string& engine);

}  // namespace blade::ral
