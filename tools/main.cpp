// The `tandem` command: one binary, one subcommand per job (see `tandem --help`).
#include <cstdio>
#include <exception>

#include "cli_common.h"
#include "commands.h"
#include "core/error.h"
#include "parallel/mpi_communicator.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: inference engine and OpenAI-compatible server for Gemma 4"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  tandem::cli::register_inspect(app);
  tandem::cli::register_logits(app);
  tandem::cli::register_generate(app);
  tandem::cli::register_synth(app);
  tandem::cli::register_quantize(app);
  tandem::cli::register_chat_template(app);
  tandem::cli::register_tokenize(app);
  tandem::cli::register_bench(app);
  tandem::cli::register_serve(app);
  // Under mpirun every rank runs the same command; a rank that fails ends the whole job, so no
  // other rank waits forever in a collective.
  auto fatal = [](const char* message) {
    std::fprintf(stderr, "tandem: error: %s\n", message);
    if (tandem::cli::world().size() > 1) tandem::cli::world().abort_job(1);
    return 1;
  };
  try {
    tandem::cli::set_world(tandem::make_world_communicator(&argc, &argv));
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    return fatal(e.what());
  }
  tandem::cli::set_world(nullptr);  // MPI_Finalize before exit
  return 0;
}
