#include "core/procfs.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace lt {

size_t peak_rss_bytes() {
  struct rusage u {};
  return getrusage(RUSAGE_SELF, &u) == 0 ? size_t(u.ru_maxrss) * 1024 : 0;  // ru_maxrss is in KiB on Linux
}

size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");  // size and resident, in pages
  size_t pages = 0, resident = 0;
  return f >> pages >> resident ? resident * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

size_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace lt
