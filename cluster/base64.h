// Base64 (RFC 4648, standard alphabet, padded): etcd's JSON gateway carries
// keys and values as base64 strings.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gpufs::cluster {

std::string Base64Encode(std::string_view bytes);
// nullopt when `text` is not padded base64 of the standard alphabet.
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace gpufs::cluster
