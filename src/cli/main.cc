// Entry point of the `tessera` binary.
#include "cli/commands.h"

int main(int argc, char** argv) { return tessera::cli::run(argc, argv); }
