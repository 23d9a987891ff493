// ops/cpu/override.cpp — the installed OpsOverride (ops/override.h).
#include "ops/override.h"

#include <atomic>

namespace lt {
namespace {
std::atomic<const OpsOverride*> installed{nullptr};
}  // namespace

const OpsOverride* ops_override() { return installed.load(std::memory_order_acquire); }
void set_ops_override(const OpsOverride* o) { installed.store(o, std::memory_order_release); }

}  // namespace lt
