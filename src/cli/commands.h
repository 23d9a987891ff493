// cli/commands.h — one register_* per subcommand; each adds its options and a callback to the app.
#pragma once

namespace CLI {
class App;
}

namespace lt::cli {

void register_grad(CLI::App& app);
void register_init(CLI::App& app);

}  // namespace lt::cli
