// cli/main.cpp — the `lazytrain` command: subcommands registered here, errors turned into one line.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"LazyTrain: train and fine-tune LLMs on hardware with far less memory than the model"};
  app.require_subcommand(1);
  lt::cli::register_grad(app);
  lt::cli::register_init(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "lazytrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lazytrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
