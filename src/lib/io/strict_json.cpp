#include "io/strict_json.h"

#include <set>
#include <vector>

#include "nvfp4mla/error.h"

namespace nvfp4mla::io {

nlohmann::json parse_strict_json(const std::string& text, const std::string& origin) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto reject_duplicates = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  // nlohmann ends its input at a NUL byte: whatever follows it would never be read.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw Error(origin + " is not valid JSON (it holds a NUL byte at offset " + std::to_string(nul) + ")");
  json doc;
  try {
    doc = json::parse(text, reject_duplicates);
  } catch (const json::exception& e) {
    // Any nlohmann exception: parse_error for syntax, out_of_range for numbers such as 1e999.
    throw Error(origin + " is not valid JSON (" + e.what() + ")");
  }
  if (!duplicate.empty()) throw Error(origin + " repeats the key '" + duplicate + "'");
  return doc;
}

}  // namespace nvfp4mla::io
