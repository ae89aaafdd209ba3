#pragma once
// JSON parsing for files the library validates strictly: nlohmann keeps the last of repeated
// keys silently, which would hide a hand-edited or damaged file, so a repeated key is an error.
#include <string>

#include <nlohmann/json.hpp>

namespace nvfp4mla::io {

// Parses `text`. Throws Error "<origin> is not valid JSON (...)" for a syntax error, a number
// out of range (1e999) or a NUL byte anywhere in `text` (nlohmann would stop reading there), and
// "<origin> repeats the key '<k>'" for a key given twice in one object.
nlohmann::json parse_strict_json(const std::string& text, const std::string& origin);

}  // namespace nvfp4mla::io
