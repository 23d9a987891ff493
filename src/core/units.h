// core/units.h — sizes as users write them: bytes, or a number with a unit.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lt {

// "1073741824", "512MiB", "1.5 GiB", "80GB", "2TiB": binary units (KiB, MiB, GiB, TiB) are powers of
// 1024, decimal ones (KB, MB, GB, TB) powers of 1000; B is optional. Anything else (negative, no
// number, unknown unit, overflow) throws an lt::Error naming `what` and the text.
size_t parse_size(std::string_view text, std::string_view what = "size");

// 1536 -> "1.5 KiB", 5e9 -> "4.66 GiB".
std::string format_bytes(double bytes);

}  // namespace lt
