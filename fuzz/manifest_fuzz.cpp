// Fuzzes parse_manifest, the reader of a store namespace's manifest.json (opened on every store
// open, `store ls`, gc and verify). Properties: an accepted manifest describes a valid namespace
// and manifest_json() of it parses back to the same parameters and digest.
#include <string>

#include "fuzz_support.h"
#include "nvfp4mla/offload/namespace.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  NamespaceParams p;
  if (!fuzz::accepts([&] { p = parse_manifest(text, "fuzz"); })) return 0;

  p.validate();  // parse_manifest promises a valid namespace: a throw here escapes as a finding
  fuzz::require(record_bytes_of_identity(p.record_identity) == p.record_bytes, "record bytes disagree with identity");
  const NamespaceParams back = parse_manifest(manifest_json(p), "round trip");
  fuzz::require(back == p, "manifest_json() does not parse back to the same namespace");
  fuzz::require(namespace_digest(back) == namespace_digest(p), "digest changed in a round trip");
  check_manifest_matches(p, back, "round trip");
  return 0;
}
