// The entry point of the CPU test programs.
#ifndef UVM_CATCH2_V3
#define CATCH_CONFIG_RUNNER
#endif
#include "catch.hpp"

int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
