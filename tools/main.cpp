// The `tandem` command: one binary, one subcommand per job (see `tandem --help`).
#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: inference engine and OpenAI-compatible server for Gemma 4"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  tandem::cli::register_inspect(app);
  tandem::cli::register_logits(app);
  tandem::cli::register_generate(app);
  tandem::cli::register_synth(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
