// train/stop_signal.cpp — the handlers behind StopSignals: async-signal-safe (one lock-free atomic store and
// sigaction), so they may interrupt anything.
#include "train/stop_signal.h"

#include <signal.h>

#include <atomic>

namespace lt {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_previous_term {}, g_previous_int {};

void on_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);  // a second one: the default action (the process ends)
}

}  // namespace

StopSignals::StopSignals() {
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress continue; the loop checks the flag between steps
  sigaction(SIGTERM, &sa, &g_previous_term);
  sigaction(SIGINT, &sa, &g_previous_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
}

bool StopSignals::requested() const { return g_signal.load() != 0; }
int StopSignals::signal() const { return g_signal.load(); }
const char* StopSignals::name() const {
  switch (g_signal.load()) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "";
  }
}

}  // namespace lt
