// core/procfs.h — what the kernel says about this process's and the machine's memory (getrusage, /proc): the
// trainer's host-memory check and its summary read these.
#pragma once

#include <cstddef>

namespace lt {

// This process's peak resident memory (getrusage's ru_maxrss); 0 if unknown.
size_t peak_rss_bytes();
// This process's resident memory now (/proc/self/statm); 0 if unknown.
size_t rss_bytes();
// The memory the kernel estimates is available for a new workload (/proc/meminfo's MemAvailable); 0 if unknown.
size_t mem_available_bytes();

}  // namespace lt
