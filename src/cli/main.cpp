// cli/main.cpp — the `lazytrain` command: subcommands registered here, errors turned into one line.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "dist/comm.h"

namespace {

// One line on stderr and a non-zero exit. Under mpirun the line names the rank, and the whole job ends at once:
// the other ranks may be waiting for this one in a collective, which would never come.
int fail(const char* what) {
  if (lt::launcher_world_size() > 1) {
    const lt::Comm& comm = lt::Comm::world();
    std::fprintf(stderr, "lazytrain: error (rank %d of %d): %s\n", comm.rank(), comm.size(), what);
    std::fflush(stderr);
    comm.abort(1);
  }
  std::fprintf(stderr, "lazytrain: error: %s\n", what);
  return 1;
}

}  // namespace

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
  lt::cli::register_export(app);
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
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
