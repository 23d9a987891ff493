// cli/commands.h — one register_* per subcommand; each adds its options and a callback to the app.
#pragma once

namespace CLI {
class App;
}

namespace lt::cli {

// Thrown by a command that finished as intended but must exit with this status (train stopped by a signal: 143);
// main() returns it without a message.
struct ExitStatus {
  int code = 0;
};

void register_bench(CLI::App& app);
void register_grad(CLI::App& app);
void register_init(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_plan(CLI::App& app);
void register_profile(CLI::App& app);
void register_simulate(CLI::App& app);
void register_train(CLI::App& app);
void register_data(CLI::App& app);
void register_eval(CLI::App& app);
void register_generate(CLI::App& app);
void register_info(CLI::App& app);
void register_devices(CLI::App& app);
void register_export(CLI::App& app);
// Adds `step` to the `bench` command group.
void add_bench_step(CLI::App& bench);

}  // namespace lt::cli
