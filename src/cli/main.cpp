// cli/main.cpp — the `lazytrain` command: subcommands registered here, errors turned into one line.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"LazyTrain: train and fine-tune LLMs on hardware with far less memory than the model"};
  app.require_subcommand(1);
  lt::cli::register_bench(app);
  lt::cli::register_grad(app);
  lt::cli::register_init(app);
  lt::cli::register_tokenize(app);
  lt::cli::register_plan(app);
  lt::cli::register_profile(app);
  lt::cli::register_simulate(app);
  lt::cli::register_train(app);
  lt::cli::register_data(app);
  lt::cli::register_eval(app);
  lt::cli::register_generate(app);
  lt::cli::register_info(app);
  lt::cli::register_devices(app);
  // `bench` groups the benchmarks; each module adds its own subcommand.
  CLI::App* bench = nullptr;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == "bench") bench = sub;
  if (!bench) bench = app.add_subcommand("bench", "benchmarks, each against a baseline in the same run");
  bench->require_subcommand(1);
  lt::cli::add_bench_step(*bench);
  try {
    lt::max_isa_from_env();  // a misspelt LT_MAX_ISA is refused before anything runs on the wrong path
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lt::cli::ExitStatus& s) {  // a command that ended as it should, with a status of its own
    return s.code;
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "lazytrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lazytrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
