// io/io_faults.cpp — the fault-injection seam (io/io_faults.h).
#include "io/io_faults.h"

#include <atomic>

namespace lt {
namespace {

std::atomic<bool> g_installed{false};
IoFaultHook& hook() {
  static IoFaultHook h;
  return h;
}

}  // namespace

const char* io_op_name(IoOp op) {
  switch (op) {
    case IoOp::write: return "write";
    case IoOp::fsync: return "fsync";
    case IoOp::rename: return "rename";
    case IoOp::nvme_read: return "nvme read";
    case IoOp::nvme_write: return "nvme write";
  }
  return "?";
}

void set_io_fault_hook(IoFaultHook h) {
  hook() = std::move(h);
  g_installed.store(bool(hook()), std::memory_order_release);
}

IoFault injected_io_fault(IoOp op, const std::string& path) {
  if (!g_installed.load(std::memory_order_relaxed)) return {};
  return hook()(op, path);
}

}  // namespace lt
