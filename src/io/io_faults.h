// io/io_faults.h — the I/O layer's one seam for fault injection (tests only). Every write, fsync and rename of the
// atomic file writers (io/json_file.h) and checkpoints, and every NVMe-tier completion, asks injected_io_fault()
// first; a test installs a hook that answers with an errno (ENOSPC, EIO, ...) or a short write, as a full disk or
// a failing drive would, and checks the error that reaches the user and what is left on disk. Without a hook —
// every real run — the call is one relaxed atomic load. This is not a mock of the file system: the real calls
// run, only their result is replaced when the hook says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace lt {

enum class IoOp : uint8_t { write, fsync, rename, nvme_read, nvme_write };
const char* io_op_name(IoOp op);  // "write", "fsync", ...

struct IoFault {
  int error = 0;                // fail the call with this errno (0: do not fail it)
  size_t max_bytes = SIZE_MAX;  // a write: move at most this many bytes in this call (a short write)
};

// What the call at `path` (a file or directory; the NVMe store's file for nvme ops) should do: {} to run as is.
using IoFaultHook = std::function<IoFault(IoOp op, const std::string& path)>;

// Installs (or with {} removes) the hook. Tests only; not while I/O runs on other threads.
void set_io_fault_hook(IoFaultHook hook);
IoFault injected_io_fault(IoOp op, const std::string& path);

}  // namespace lt
