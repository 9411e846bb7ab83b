// The entry point of the CPU test programs.
#if !__has_include(<catch2/catch_all.hpp>)
#define CATCH_CONFIG_RUNNER
#endif
#include "catch.hpp"

int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
