// cli/cmd_grad.cpp — `lazytrain grad`: loss and every parameter gradient of an HF model for one batch.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {

void register_grad(CLI::App& app) {
  auto* cmd = app.add_subcommand("grad", "compute the loss and all parameter gradients for one batch");
  cmd->callback([]() { LT_FAIL("grad: not built yet"); });
}

}  // namespace lt::cli
