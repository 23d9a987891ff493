// train/stop_signal.h — a request to stop training at the next step boundary: SIGTERM (a scheduler preempting the
// job, `kill`) or SIGINT (Ctrl-C). The first signal sets a flag the training loop reads after each step; it also
// restores the signal's default action, so a second one ends the process at once (checkpoints are written to a
// temporary name and renamed, so even that loses nothing but the steps since the last checkpoint).
#pragma once

namespace lt {

class StopSignals {
 public:
  StopSignals();   // installs the handlers for SIGTERM and SIGINT
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  bool requested() const;
  int signal() const;         // the first signal received (0: none)
  const char* name() const;   // "SIGTERM", "SIGINT", or "" when none
};

}  // namespace lt
