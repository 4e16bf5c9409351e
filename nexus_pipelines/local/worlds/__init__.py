"""Provider worlds: a simulator's state, its in-process transport, and the registration
and adapter that talk to it; and the plant that runs a world's registrations through the
code location's own poll, routing and drain on a real control plane. The test suites and
the benchmarks in bench/ both drive them, so neither imports the other."""
